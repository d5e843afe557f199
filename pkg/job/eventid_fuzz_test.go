package job_test

import (
	"context"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"bulwark/pkg/job"
	"bulwark/pkg/testkit/testenv"
)

// eventIDShape is the shape of a Redis stream id as the SSE stream sends
// it: two decimals in canonical form (no sign, no leading zero).
var eventIDShape = regexp.MustCompile(`^(0|[1-9][0-9]*)-(0|[1-9][0-9]*)$`)

// FuzzValidEventID fuzzes the decoder of a client's Last-Event-ID header
// (and of the last_event_id query parameter). ValidEventID must accept
// exactly the ids "<ms>-<seq>" of two unsigned 64-bit decimals in canonical
// form whose time is at most a minute ahead; CompareIDs must order every id
// it accepts by (ms, seq); and Redis must take every id it accepts as the
// exclusive start of the replay, which then returns exactly the stored
// events after it. An id that passes the check but that Redis refuses
// would silently skip the replay of a reconnecting stream (an id padded
// with zeros past Redis's length limit did: testdata/fuzz/FuzzValidEventID).
func FuzzValidEventID(f *testing.F) {
	ctx := context.Background()
	rdb := testenv.Redis(f)
	store := job.NewStore(rdb, "fz:", time.Hour)
	stored := []string{"1000-0", "1000-1", "2000-0"}
	for _, id := range stored {
		// The stream of request r1, keyed as pkg/job lays it out.
		err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: "fz:ev:r1", ID: id, Values: map[string]any{"e": `{"type":"queued"}`}}).Err()
		if err != nil {
			f.Fatal(err)
		}
	}
	now := time.UnixMilli(1_800_000_000_000)
	for _, s := range []string{
		"", "0-0", "1000-0", "1000-1", "1999-18446744073709551615", "2000-0", "1800000060000-0", "1800000060001-0",
		"18446744073709551615-0", "1-18446744073709551616", "00001000-0", "garbage", "12-x", "-", "1-", "-1",
		"+1-0", "1-+0", " 1-0", "1-0 ", "0x10-0", "1_000-0", "1-2-3", "1.5-0", "１-0", "1000-00", "01-0",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, id string) {
		ms, seq, want := parseEventID(id, now)
		if got := job.ValidEventID(id, now); got != want {
			t.Fatalf("ValidEventID(%q) = %v, want %v", id, got, want)
		}
		if !want {
			return
		}
		if c := job.CompareIDs(id, id); c != 0 {
			t.Fatalf("CompareIDs(%q, itself) = %d", id, c)
		}
		var after []string
		for _, s := range stored {
			sms, sseq, _ := parseEventID(s, now)
			w := cmpPair(ms, seq, sms, sseq)
			if c := job.CompareIDs(id, s); c != w {
				t.Fatalf("CompareIDs(%q, %q) = %d, want %d", id, s, c, w)
			}
			if c := job.CompareIDs(s, id); c != -w {
				t.Fatalf("CompareIDs(%q, %q) = %d, want %d", s, id, c, -w)
			}
			if w < 0 {
				after = append(after, s)
			}
		}
		evs, err := store.Events(ctx, "r1", id)
		if err != nil {
			t.Fatalf("the replay after the valid id %q fails: %v", id, err)
		}
		var got []string
		for _, ev := range evs {
			got = append(got, ev.ID)
		}
		if strings.Join(got, ",") != strings.Join(after, ",") {
			t.Fatalf("the replay after %q returned %v, want %v", id, got, after)
		}
	})
}

// parseEventID is the specification of ValidEventID, written differently.
func parseEventID(id string, now time.Time) (ms, seq uint64, ok bool) {
	if !eventIDShape.MatchString(id) {
		return 0, 0, false
	}
	a, b, _ := strings.Cut(id, "-")
	ms, err1 := strconv.ParseUint(a, 10, 64)
	seq, err2 := strconv.ParseUint(b, 10, 64)
	if err1 != nil || err2 != nil {
		return 0, 0, false
	}
	return ms, seq, ms <= uint64(now.Add(time.Minute).UnixMilli())
}

func cmpPair(am, as, bm, bs uint64) int {
	switch {
	case am < bm || am == bm && as < bs:
		return -1
	case am == bm && as == bs:
		return 0
	}
	return 1
}
