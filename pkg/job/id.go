package job

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// idPrefix starts every request id.
const idPrefix = "req_"

// idTimeLen is the length of the creation time's milliseconds in an id:
// milliseconds since the epoch in base 36, eight digits until 2059. The
// microseconds within the millisecond follow, in idMicroLen hex digits.
const (
	idTimeLen  = 8
	idMicroLen = 3
)

// NewID returns the id of a request created at created: unguessable, and
// ordered by creation time to the microsecond (IDTime reads it back), so
// that the order of ids is the order in which the slots serve waiting
// requests (oldest Job.CreatedAt first, ties of a millisecond by id).
// Milliseconds alone left two requests of one millisecond in the random
// order of the rest of their ids: the later could be served, and shown
// its place, first.
func NewID(created time.Time) string {
	b := make([]byte, 10)
	_, _ = rand.Read(b)
	micro := created.UnixMicro() % 1000
	if micro < 0 {
		micro += 1000
	}
	return idPrefix + strconv.FormatInt(created.UnixMilli(), 36) + fmt.Sprintf("%03x", micro) + hex.EncodeToString(b)
}

// IDTime returns the creation time encoded in an id made by NewID; false
// for any other string. (An id made before the microseconds were added
// reads as some microseconds into its millisecond.)
func IDTime(id string) (time.Time, bool) {
	rest, ok := strings.CutPrefix(id, idPrefix)
	if !ok || len(rest) < idTimeLen {
		return time.Time{}, false
	}
	ms, err := strconv.ParseInt(rest[:idTimeLen], 36, 64)
	if err != nil {
		return time.Time{}, false
	}
	at := time.UnixMilli(ms)
	if len(rest) >= idTimeLen+idMicroLen {
		if us, err := strconv.ParseInt(rest[idTimeLen:idTimeLen+idMicroLen], 16, 64); err == nil && us < 1000 {
			at = at.Add(time.Duration(us) * time.Microsecond)
		}
	}
	return at, true
}
