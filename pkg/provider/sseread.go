package provider

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
)

// Event is one Server-Sent Event as EventReader reads it.
type Event struct {
	// Name is the event type its "event:" field gave, "" when it had none
	// (a browser would call it "message").
	Name string
	// Data is the values of its "data:" fields joined with newlines.
	Data []byte
}

// EventReader reads Server-Sent Events from a stream by the rules of the
// WHATWG HTML standard ("Interpreting an event stream"), which both
// providers' SDKs follow: lines end in CRLF, LF or CR; a line starting
// with ':' is a comment (the providers' keep-alives); "field: value" drops
// one space after the colon, and a line without a colon is a field with an
// empty value; "data" lines accumulate, joined with newlines; a blank line
// ends the event, which is returned only if it had a data field; a leading
// byte order mark is skipped. The "id" and "retry" fields and unknown
// fields are ignored: Bulwark never reconnects to resume a stream.
//
// It reads its input as it arrives and returns each event as soon as its
// blank line has been read, without waiting for more. Lines are not
// bounded: the caller bounds the input (DoStream does, by the call's
// response limit). An EventReader is not safe for concurrent use.
//
// No library does this for us: the SDKs' ssestream packages are
// importable, but only tests link the SDKs today, their decoders take a
// whole *http.Response and a process-wide registry of content types, and
// neither ends a line at a lone CR.
type EventReader struct {
	r *bufio.Reader
	// line is the line being read, reused from one line to the next.
	line []byte
	// afterCR says the last line ended in CR, so that a LF right after it
	// belongs to the same line ending; remembered rather than peeked for,
	// because peeking would wait for a byte the provider may not send yet.
	afterCR bool
	// started says the first line was read (the one a BOM may open).
	started bool
}

// NewEventReader returns an EventReader reading from r.
func NewEventReader(r io.Reader) *EventReader {
	return &EventReader{r: bufio.NewReader(r)}
}

// utf8BOM is the byte order mark a stream may begin with.
var utf8BOM = []byte("\xEF\xBB\xBF")

// Next returns the next event. At the end of the stream it returns io.EOF;
// an event the stream ends in the middle of (before its blank line) is
// dropped, as the standard says: its data may be cut off too. A failure to
// read is returned wrapped.
func (er *EventReader) Next() (Event, error) {
	var name string
	var data []byte
	hasData := false
	for {
		line, err := er.readLine()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return Event{}, io.EOF
			}
			return Event{}, fmt.Errorf("sse: read: %w", err)
		}
		if len(line) == 0 {
			if hasData {
				if data == nil {
					data = []byte{} // "data:" alone: present, empty
				}
				return Event{Name: name, Data: data}, nil
			}
			name = "" // an event without data is not dispatched
			continue
		}
		if line[0] == ':' {
			continue
		}
		field, value, found := bytes.Cut(line, []byte(":"))
		if found && len(value) > 0 && value[0] == ' ' {
			value = value[1:]
		}
		switch string(field) {
		case "event":
			name = string(value)
		case "data":
			if hasData {
				data = append(data, '\n')
			}
			data = append(data, value...)
			hasData = true
		}
	}
}

// readLine returns the next line without its ending. The slice is valid
// until the next call. A line the stream ends in without a line ending is
// io.EOF: it cannot end an event.
func (er *EventReader) readLine() ([]byte, error) {
	er.line = er.line[:0]
	for {
		c, err := er.r.ReadByte()
		if err != nil {
			return nil, err
		}
		if er.afterCR {
			er.afterCR = false
			if c == '\n' {
				continue
			}
		}
		switch c {
		case '\r':
			er.afterCR = true
			return er.firstLine(), nil
		case '\n':
			return er.firstLine(), nil
		}
		er.line = append(er.line, c)
	}
}

// firstLine returns er.line, without a BOM when it is the stream's first.
func (er *EventReader) firstLine() []byte {
	if er.started {
		return er.line
	}
	er.started = true
	return bytes.TrimPrefix(er.line, utf8BOM)
}
