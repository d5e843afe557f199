package bedrock

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"bulwark/pkg/llm"
	"bulwark/pkg/testkit/mockprovider"
	"bulwark/pkg/testkit/providertest"
	"bulwark/pkg/testkit/wiretest"
)

// streamMock starts the mock provider with cfg and returns it with a
// Client signing for it.
func streamMock(t *testing.T, cfg mockprovider.Config) (*mockprovider.Server, *Client) {
	t.Helper()
	cfg.DefaultLimits = mockprovider.Limits{RPM: 6000, TPM: 1000000}
	srv, err := mockprovider.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv)
	t.Cleanup(ts.Close)
	t.Cleanup(srv.Close)
	return srv, testClient(ts.URL, ts.Client(), staticCreds(testAKID, testSecret, testToken))
}

// toolRequest asks the mock for tool calls.
func toolRequest(model string) *llm.Request {
	req := textRequest(model)
	req.Messages[0].Content[0].Text = "run fetch_logs and search_kb"
	for _, name := range []string{"fetch_logs", "search_kb"} {
		req.Tools = append(req.Tools, llm.Tool{Name: name, Description: "d", InputSchema: json.RawMessage(`{"type":"object"}`)})
	}
	return req
}

// timedDeltas records deltas and when the first came.
type timedDeltas struct {
	deltas []llm.Delta
	first  time.Time
}

func (d *timedDeltas) emit(x llm.Delta) {
	if len(d.deltas) == 0 {
		d.first = time.Now()
	}
	d.deltas = append(d.deltas, x)
}

// Against the mock over HTTP, a streamed answer is Complete's, its deltas
// add up to it and arrive while the stream goes on.
func TestStreamMockMatchesComplete(t *testing.T) {
	t.Parallel()
	const interval = 5 * time.Millisecond
	srv, c := streamMock(t, mockprovider.Config{StreamChunkInterval: interval, StreamFirstToken: -1})
	for _, tt := range []struct {
		name string
		req  *llm.Request
		want llm.BlockType
	}{
		{"text", textRequest(testModel), llm.BlockText},
		{"tool use", toolRequest(testModel), llm.BlockToolUse},
	} {
		t.Run(tt.name, func(t *testing.T) {
			want, err := c.Complete(t.Context(), cred(testRegion), tt.req)
			if err != nil {
				t.Fatal(err)
			}
			var rec timedDeltas
			got, err := c.Stream(t.Context(), cred(testRegion), tt.req, rec.emit)
			end := time.Now()
			if err != nil {
				t.Fatal(err)
			}
			// Each answer has an id of its own.
			if got.Response.ID == "" {
				t.Error("no message id")
			}
			got.Response.ID = want.Response.ID
			if d := wiretest.Diff(want.Response, got.Response); d != "" {
				t.Errorf("Stream's answer differs from Complete's (-Complete +Stream):\n%s", d)
			}
			if !hasBlock(got.Response, tt.want) {
				t.Errorf("no %s block in %+v", tt.want, got.Response.Content)
			}
			providertest.CheckDeltas(t, rec.deltas, got.Response.Content)
			// The chunks go out interval apart: the first delta came at
			// least one interval before the end.
			if len(rec.deltas) < 3 || end.Sub(rec.first) < interval {
				t.Errorf("%d deltas, the first %s before the end: want several, before the end", len(rec.deltas), end.Sub(rec.first))
			}
			if got.Latency <= 0 {
				t.Errorf("latency %s", got.Latency)
			}
		})
	}
	if st := srv.Stats(); st.Providers["bedrock"].OK != 4 || st.InFlight != 0 {
		t.Errorf("stats %+v: want 4 answers, none in flight", st.Providers["bedrock"])
	}
}

func hasBlock(resp *llm.Response, typ llm.BlockType) bool {
	for _, b := range resp.Content {
		if b.Type == typ {
			return true
		}
	}
	return false
}

// The mock's stream faults: an exception message is classified by
// Bedrock's table, a cut connection is transient; both after deltas.
func TestStreamMockFaults(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		mode  mockprovider.FaultMode
		class llm.Class
		code  string
	}{
		{mockprovider.FaultStreamError, llm.ClassTransient, "ModelStreamErrorException"},
		{mockprovider.FaultStreamCut, llm.ClassTransient, ""},
	} {
		t.Run(string(tt.mode), func(t *testing.T) {
			t.Parallel()
			srv, c := streamMock(t, mockprovider.Config{StreamChunkInterval: -1, StreamFirstToken: -1})
			// The message quotes the credentials, which must not come back.
			msg := "stream failed for " + testAKID + " token " + testToken
			if err := srv.SetFault(mockprovider.Fault{Provider: "bedrock", Mode: tt.mode, AfterChunks: 2, Message: msg}); err != nil {
				t.Fatal(err)
			}
			var rec timedDeltas
			_, err := c.Stream(t.Context(), cred(testRegion), textRequest(testModel), rec.emit)
			var pe *llm.Error
			if !errors.As(err, &pe) {
				t.Fatalf("error %v is not an *llm.Error", err)
			}
			if pe.Class != tt.class || pe.Code != tt.code || pe.Provider != ProviderDefault {
				t.Errorf("got %+v; want %s, code %q", pe, tt.class, tt.code)
			}
			if len(rec.deltas) == 0 {
				t.Error("no delta before the failure")
			}
			checkNoSecret(t, err)
		})
	}
}

// checkNoSecret checks that no rendering of err holds the test credentials.
func checkNoSecret(t *testing.T, err error) {
	t.Helper()
	for _, s := range []string{err.Error(), fmt.Sprintf("%+v", err), fmt.Sprintf("%#v", err)} {
		for _, secret := range []string{testAKID, testSecret, testToken} {
			if strings.Contains(s, secret) {
				t.Errorf("error text leaks %q: %s", secret, s)
			}
		}
	}
}

// A caller that cancels mid-stream gets its context's error, unclassified.
func TestStreamMockCancel(t *testing.T) {
	t.Parallel()
	_, c := streamMock(t, mockprovider.Config{StreamChunkInterval: time.Hour, StreamFirstToken: -1})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	_, err := c.Stream(ctx, cred(testRegion), textRequest(testModel), func(llm.Delta) { cancel() })
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("error %v, want context.Canceled", err)
	}
	if _, ok := llm.ClassOf(err); ok {
		t.Errorf("a cancellation must not be classified: %v", err)
	}
}

// docMessage encodes one event-stream message as the "Amazon event stream
// encoding" describes it, independently of the SDK's encoder: a prelude of
// total length and headers length (big-endian uint32), its CRC32, headers
// (name length byte, name, value type 7 = string, value length uint16,
// value), the payload, and the CRC32 of everything before it.
func docMessage(headers [][2]string, payload []byte) []byte {
	var h bytes.Buffer
	for _, kv := range headers {
		h.WriteByte(byte(len(kv[0])))
		h.WriteString(kv[0])
		h.WriteByte(7)
		_ = binary.Write(&h, binary.BigEndian, uint16(len(kv[1])))
		h.WriteString(kv[1])
	}
	var m bytes.Buffer
	_ = binary.Write(&m, binary.BigEndian, uint32(12+h.Len()+len(payload)+4))
	_ = binary.Write(&m, binary.BigEndian, uint32(h.Len()))
	_ = binary.Write(&m, binary.BigEndian, crc32.ChecksumIEEE(m.Bytes()))
	m.Write(h.Bytes())
	m.Write(payload)
	_ = binary.Write(&m, binary.BigEndian, crc32.ChecksumIEEE(m.Bytes()))
	return m.Bytes()
}

// docChunk is a chunk event carrying one Anthropic event's JSON.
func docChunk(event string) []byte {
	payload := fmt.Sprintf(`{"bytes":%q}`, base64.StdEncoding.EncodeToString([]byte(event)))
	return docMessage([][2]string{{":event-type", "chunk"}, {":content-type", "application/json"}, {":message-type", "event"}}, []byte(payload))
}

// docException is an exception message of member typ.
func docException(typ, message string) []byte {
	return docMessage([][2]string{{":exception-type", typ}, {":content-type", "application/json"}, {":message-type", "exception"}},
		fmt.Appendf(nil, `{"message":%q}`, message))
}

// docEvents is the Messages stream of the user guide's example, a text
// answer and a tool call, as Bedrock sends it (message_stop carrying its
// invocation metrics).
var docEvents = []string{
	`{"type":"message_start","message":{"id":"msg_bdrk_01","type":"message","role":"assistant","model":"claude-3-5-sonnet-20240620","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":21,"output_tokens":1}}}`,
	`{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`,
	`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Checking "}}`,
	`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"the logs."}}`,
	`{"type":"content_block_stop","index":0}`,
	`{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_01","name":"fetch_logs","input":{}}}`,
	`{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"batch\":"}}`,
	`{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"42}"}}`,
	`{"type":"content_block_stop","index":1}`,
	`{"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":17}}`,
	`{"type":"message_stop","amazon-bedrock-invocationMetrics":{"inputTokenCount":21,"outputTokenCount":17,"invocationLatency":812,"firstByteLatency":301}}`,
}

// docStream is docEvents framed, or the first n of them followed by tail.
func docStream(n int, tail ...[]byte) []byte {
	var b bytes.Buffer
	for _, ev := range docEvents[:n] {
		b.Write(docChunk(ev))
	}
	for _, t := range tail {
		b.Write(t)
	}
	return b.Bytes()
}

// ReadStream reads frames encoded by the documentation's description.
func TestReadStreamGolden(t *testing.T) {
	t.Parallel()
	var deltas []llm.Delta
	got, err := ReadStream(bytes.NewReader(docStream(len(docEvents))), func(d llm.Delta) { deltas = append(deltas, d) })
	if err != nil {
		t.Fatal(err)
	}
	want := &llm.Response{ID: "msg_bdrk_01", Model: "claude-3-5-sonnet-20240620", StopReason: llm.StopToolUse,
		Content: []llm.Block{
			{Type: llm.BlockText, Text: "Checking the logs."},
			{Type: llm.BlockToolUse, ToolUseID: "toolu_01", ToolName: "fetch_logs", Input: json.RawMessage(`{"batch":42}`)},
		},
		Usage: llm.Usage{InputTokens: 21, OutputTokens: 17}}
	if d := wiretest.Diff(want, got); d != "" {
		t.Errorf("answer (-want +got):\n%s", d)
	}
	providertest.CheckDeltas(t, deltas, got.Content)
}

func TestReadStreamMalformed(t *testing.T) {
	t.Parallel()
	whole := docStream(len(docEvents))
	bad := bytes.Clone(whole)
	bad[len(docChunk(docEvents[0]))-1] ^= 0xff // the first message's CRC
	for name, body := range map[string][]byte{
		"ends before message_stop": docStream(4),
		"cut inside a message":     whole[:len(whole)-7],
		"bad CRC":                  bad,
		"not an event stream":      []byte("<html>maintenance</html>"),
		"chunk not JSON":           docMessage([][2]string{{":message-type", "event"}, {":event-type", "chunk"}}, []byte("{")),
	} {
		if _, err := ReadStream(bytes.NewReader(body), nil); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

// eventStreamServer answers every request (after checking its signature
// and path) with status, and body as an event stream when status is 200.
func eventStreamServer(t *testing.T, status int, header map[string]string, body []byte) *Client {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reqBody, _ := io.ReadAll(r.Body)
		if err := verifySigV4(r, reqBody, testSecret); err != nil {
			t.Error(err)
		}
		if r.URL.EscapedPath() != StreamPath(testModel) || r.Header.Get("Accept") != EventStreamContentType {
			t.Errorf("path %s, Accept %q", r.URL.EscapedPath(), r.Header.Get("Accept"))
		}
		for k, v := range header {
			w.Header().Set(k, v)
		}
		if status == http.StatusOK {
			w.Header().Set("Content-Type", EventStreamContentType)
		}
		w.WriteHeader(status)
		_, _ = w.Write(body)
	}))
	t.Cleanup(srv.Close)
	return testClient(srv.URL, srv.Client(), staticCreds(testAKID, testSecret, testToken))
}

// An exception mid-stream is classified as an error answer of its type.
func TestStreamExceptions(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		typ   string
		class llm.Class
		code  string
	}{
		{"throttlingException", llm.ClassRateLimited, "ThrottlingException"},
		{"modelStreamErrorException", llm.ClassTransient, "ModelStreamErrorException"},
		{"internalServerException", llm.ClassTransient, "InternalServerException"},
		{"modelTimeoutException", llm.ClassTransient, "ModelTimeoutException"},
		{"serviceUnavailableException", llm.ClassOverloaded, "ServiceUnavailableException"},
		{"validationException", llm.ClassPermanent, "ValidationException"},
	} {
		t.Run(tt.typ, func(t *testing.T) {
			t.Parallel()
			c := eventStreamServer(t, http.StatusOK, nil, docStream(3, docException(tt.typ, "failed for "+testAKID)))
			var deltas []llm.Delta
			_, err := c.Stream(t.Context(), cred(testRegion), textRequest(testModel), func(d llm.Delta) { deltas = append(deltas, d) })
			var pe *llm.Error
			if !errors.As(err, &pe) {
				t.Fatalf("error %v is not an *llm.Error", err)
			}
			if pe.Class != tt.class || pe.Code != tt.code || !strings.Contains(pe.Message, "failed for") {
				t.Errorf("got %+v; want %s, %s", pe, tt.class, tt.code)
			}
			if len(deltas) == 0 {
				t.Error("no delta before the exception")
			}
			checkNoSecret(t, err)
		})
	}
}

// Before the stream, an error answer fails Stream exactly as Complete.
func TestStreamErrorAnswerAsComplete(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		status int
		typ    string
	}{
		{http.StatusTooManyRequests, "ThrottlingException"},
		{http.StatusServiceUnavailable, "ServiceUnavailableException"},
		{http.StatusForbidden, "UnrecognizedClientException"},
		{http.StatusBadRequest, "ValidationException"},
	} {
		header := map[string]string{"x-amzn-ErrorType": tt.typ + ":http://internal.amazon.com/coral/com.amazon.bedrock/"}
		body := fmt.Appendf(nil, `{"message":"refused %s"}`, testAKID)
		want := failure(t, testClient(fakeBedrock(t, "", testSecret, answer{status: tt.status, header: header, body: body}, nil).URL,
			nil, staticCreds(testAKID, testSecret, testToken)), cred(testRegion), textRequest(testModel))
		c := eventStreamServer(t, tt.status, header, body)
		_, err := c.Stream(t.Context(), cred(testRegion), textRequest(testModel), nil)
		var got *llm.Error
		if !errors.As(err, &got) {
			t.Fatalf("%s: error %v is not an *llm.Error", tt.typ, err)
		}
		if d := cmp.Diff(want, got); d != "" {
			t.Errorf("%s: Stream's error differs from Complete's (-Complete +Stream):\n%s", tt.typ, d)
		}
		checkNoSecret(t, err)
	}
}
