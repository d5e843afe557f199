package provider

import (
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/google/go-cmp/cmp"
)

// readEvents reads every event of r.
func readEvents(r io.Reader) ([]Event, error) {
	er := NewEventReader(r)
	var out []Event
	for {
		ev, err := er.Next()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		out = append(out, ev)
	}
}

func ev(name, data string) Event { return Event{Name: name, Data: []byte(data)} }

// The rules of the WHATWG HTML standard, "Interpreting an event stream".
func TestEventReader(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, stream string
		want         []Event
	}{
		{"named event", "event: add\ndata: 73857293\n\n", []Event{ev("add", "73857293")}},
		{"unnamed event", "data: x\n\n", []Event{ev("", "x")}},
		{"no space after the colon", "data:x\n\n", []Event{ev("", "x")}},
		{"only one space is dropped", "data:  x \n\n", []Event{ev("", " x ")}},
		{"data lines join with LF", "data: YHOO\ndata: +2\ndata: 10\n\n", []Event{ev("", "YHOO\n+2\n10")}},
		{"colons in the value stay", `data: {"a":"b:c"}` + "\n\n", []Event{ev("", `{"a":"b:c"}`)}},
		{"a field without a colon has an empty value", "data\n\ndata\ndata\n\n", []Event{ev("", ""), ev("", "\n")}},
		{"an empty data field", "data:\n\n", []Event{ev("", "")}},
		{"comments are ignored", ": ping\n:\ndata: x\n: between\n\n", []Event{ev("", "x")}},
		{"an event without data is not dispatched, and its name does not carry over",
			"event: ping\n\ndata: x\n\n", []Event{ev("", "x")}},
		{"id, retry and unknown fields are ignored", "id: 1\nretry: 10000\nfoo: bar\ndata: x\n\n", []Event{ev("", "x")}},
		{"the event field's last value wins", "event: a\nevent: b\ndata: x\n\n", []Event{ev("b", "x")}},
		{"blank lines between events", "\n\ndata: a\n\n\n\ndata: b\n\n", []Event{ev("", "a"), ev("", "b")}},
		{"CRLF", "event: e\r\ndata: a\r\n\r\n", []Event{ev("e", "a")}},
		{"CR", "data: a\rdata: b\r\rdata: c\r\r", []Event{ev("", "a\nb"), ev("", "c")}},
		{"mixed line endings", "data: a\r\ndata: b\ndata: c\r\r\n\ndata: d\n\n", []Event{ev("", "a\nb\nc"), ev("", "d")}},
		{"a leading BOM is skipped", "\xEF\xBB\xBFdata: a\n\n", []Event{ev("", "a")}},
		{"a BOM elsewhere is part of the field name", "data: a\n\n\xEF\xBB\xBFdata: b\n\n", []Event{ev("", "a")}},
		{"an event the stream ends in is dropped", "data: a\n\ndata: b\n", []Event{ev("", "a")}},
		{"a line the stream ends in is dropped", "data: a\n\ndata: b", []Event{ev("", "a")}},
		{"empty", "", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			// Whole, a byte at a time, and with EOF on the last data: how
			// reads split must not matter.
			for _, r := range []io.Reader{
				strings.NewReader(tt.stream),
				iotest.OneByteReader(strings.NewReader(tt.stream)),
				iotest.DataErrReader(strings.NewReader(tt.stream)),
			} {
				got, err := readEvents(r)
				if err != nil {
					t.Fatal(err)
				}
				if d := cmp.Diff(tt.want, got); d != "" {
					t.Errorf("events (-want +got):\n%s", d)
				}
			}
		})
	}
}

// onceReader yields its data in one read and fails the test if read again.
type onceReader struct {
	t    *testing.T
	data string
	done bool
}

func (r *onceReader) Read(p []byte) (int, error) {
	if r.done {
		r.t.Error("read past the event: the reader waited for more input")
		return 0, io.EOF
	}
	r.done = true
	return copy(p, r.data), nil
}

// An event is returned as soon as its blank line is read, even when that
// line ends in a lone CR: the reader must not wait for a LF that may come
// with the next event, seconds later.
func TestEventReaderDoesNotWait(t *testing.T) {
	t.Parallel()
	for _, stream := range []string{"data: a\n\n", "data: a\r\n\r\n", "data: a\r\r"} {
		got, err := NewEventReader(&onceReader{t: t, data: stream}).Next()
		if err != nil || string(got.Data) != "a" {
			t.Errorf("%q: %+v, %v", stream, got, err)
		}
	}
}

func TestEventReaderReadError(t *testing.T) {
	t.Parallel()
	boom := errors.New("connection reset")
	r := io.MultiReader(strings.NewReader("data: a\n\ndata: b"), iotest.ErrReader(boom))
	got, err := readEvents(r)
	if !errors.Is(err, boom) || len(got) != 1 {
		t.Errorf("events %v, error %v; want one event, then %v", got, err, boom)
	}
}
