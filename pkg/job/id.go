package job

import (
	"crypto/rand"
	"encoding/hex"
	"strconv"
	"strings"
	"time"
)

// idPrefix starts every request id.
const idPrefix = "req_"

// idTimeLen is the length of the creation time in an id: milliseconds
// since the epoch in base 36, eight digits until 2059.
const idTimeLen = 8

// NewID returns the id of a request created at created: unguessable, and
// ordered by creation time to the millisecond (IDTime reads it back), so
// that the order of ids is the order in which the slots serve waiting
// requests (oldest Job.CreatedAt first).
func NewID(created time.Time) string {
	b := make([]byte, 10)
	_, _ = rand.Read(b)
	return idPrefix + strconv.FormatInt(created.UnixMilli(), 36) + hex.EncodeToString(b)
}

// IDTime returns the creation time encoded in an id made by NewID; false
// for any other string.
func IDTime(id string) (time.Time, bool) {
	rest, ok := strings.CutPrefix(id, idPrefix)
	if !ok || len(rest) < idTimeLen {
		return time.Time{}, false
	}
	ms, err := strconv.ParseInt(rest[:idTimeLen], 36, 64)
	if err != nil {
		return time.Time{}, false
	}
	return time.UnixMilli(ms), true
}
