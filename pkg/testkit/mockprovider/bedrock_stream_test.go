package mockprovider

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/protocol/eventstream"
	"github.com/aws/aws-sdk-go-v2/service/bedrockruntime"
	"github.com/aws/aws-sdk-go-v2/service/bedrockruntime/types"
	"github.com/google/go-cmp/cmp"
)

// invokeStream calls InvokeModelWithResponseStream with the SDK and
// returns the Anthropic events its chunks carry, and the stream's error.
func invokeStream(t *testing.T, c *bedrockruntime.Client, model string, body any) ([]sseMsg, error) {
	t.Helper()
	raw, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	out, err := c.InvokeModelWithResponseStream(t.Context(), &bedrockruntime.InvokeModelWithResponseStreamInput{
		ModelId: aws.String(model), Body: raw, ContentType: aws.String("application/json"),
	})
	if err != nil {
		t.Fatal(err)
	}
	stream := out.GetStream()
	defer stream.Close()
	var msgs []sseMsg
	for ev := range stream.Events() {
		chunk, ok := ev.(*types.ResponseStreamMemberChunk)
		if !ok {
			t.Fatalf("an event of type %T", ev)
		}
		var e struct{ Type string }
		if err := json.Unmarshal(chunk.Value.Bytes, &e); err != nil {
			t.Fatalf("chunk %q: %v", chunk.Value.Bytes, err)
		}
		msgs = append(msgs, sseMsg{event: e.Type, data: string(chunk.Value.Bytes)})
	}
	return msgs, stream.Err()
}

// The official SDK reads the stream; its chunks' events add up to the
// answer InvokeModel gives, text and tool calls alike.
func TestBedrockStreamSDK(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{DefaultLimits: Limits{RPM: 6000, TPM: 1000000}, StreamChunkInterval: -1})
	c := bedrockSDK(b, bedrockAKID, "us-east-1")
	tools := claudeTools("run fetch_logs and search_kb", "fetch_logs", "search_kb")
	delete(tools, "model")
	tools["anthropic_version"] = BedrockAnthropicVersion
	for name, body := range map[string]map[string]any{
		"text":       bedrockBody(streamPrompt, 200),
		"max_tokens": bedrockBody(streamPrompt, 3),
		"tool calls": tools,
	} {
		out, err := invoke(t, c, bedrockModel, body)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		want := decodeClaudeAnswer(t, reply{status: http.StatusOK, body: out.Body})
		msgs, err := invokeStream(t, c, bedrockModel, body)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for _, m := range msgs {
			if m.event == "ping" {
				t.Errorf("%s: a ping chunk", name)
			}
		}
		if d := cmp.Diff(want, accumulateClaude(t, msgs)); d != "" {
			t.Errorf("%s: streamed answer (-InvokeModel +stream):\n%s", name, d)
		}
	}
	if st := b.srv.Stats(); st.Providers["bedrock"].OK != 6 || st.InFlight != 0 {
		t.Errorf("stats %+v, want 6 OK and none in flight", st.Providers["bedrock"])
	}
}

// A FaultStreamError ends the stream with the exception the SDK types as
// ModelStreamErrorException, after the chunks the fault lets out.
func TestBedrockStreamSDKFault(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{StreamChunkInterval: -1})
	if err := b.srv.SetFault(Fault{Provider: "bedrock", Mode: FaultStreamError, AfterChunks: 2, Message: "model broke"}); err != nil {
		t.Fatal(err)
	}
	msgs, err := invokeStream(t, bedrockSDK(b, bedrockAKID, "us-east-1"), bedrockModel, bedrockBody(streamPrompt, 200))
	var me *types.ModelStreamErrorException
	if !errors.As(err, &me) || aws.ToString(me.Message) != "model broke" {
		t.Fatalf("error %v, want ModelStreamErrorException \"model broke\"", err)
	}
	deltas := 0
	for _, m := range msgs {
		if m.event == "content_block_delta" {
			deltas++
		}
	}
	if deltas != 2 {
		t.Errorf("%d deltas before the exception, want 2", deltas)
	}
	if got := b.srv.Stats().Providers["bedrock"]; got.Injected[FaultStreamError] != 1 {
		t.Errorf("stats %+v, want the fault counted", got)
	}
}

// The wire itself: status 200, the event-stream media type, the request
// id, and messages whose headers are Bedrock's; a cut fault ends it
// without message_stop.
func TestBedrockStreamWire(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{StreamChunkInterval: -1})
	post := func() reply {
		body, _ := json.Marshal(bedrockBody(streamPrompt, 200))
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost,
			b.url+"/model/"+strings.ReplaceAll(bedrockModel, ":", "%3A")+"/invoke-with-response-stream", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(body)
		signV4(bedrockAKID, "us-east-1")(req, hex.EncodeToString(sum[:]))
		resp, err := b.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body) // a cut stream ends in an error
		return reply{status: resp.StatusCode, header: resp.Header, body: raw}
	}
	r := post()
	if r.status != http.StatusOK || r.header.Get("Content-Type") != bedrockEventStream || r.header.Get("x-amzn-RequestId") == "" {
		t.Fatalf("status %d, headers %v", r.status, r.header)
	}
	msgs := decodeEventStream(t, r.body)
	if len(msgs) < 3 {
		t.Fatalf("%d messages", len(msgs))
	}
	for _, m := range msgs {
		if m.Headers.Get(":message-type").String() != "event" || m.Headers.Get(":event-type").String() != "chunk" ||
			m.Headers.Get(":content-type").String() != "application/json" {
			t.Errorf("headers %v", m.Headers)
		}
	}

	if err := b.srv.SetFault(Fault{Provider: "bedrock", Mode: FaultStreamCut, AfterChunks: 1}); err != nil {
		t.Fatal(err)
	}
	cut := post()
	if len(cut.body) >= len(r.body) {
		t.Errorf("a cut stream of %d bytes (whole: %d)", len(cut.body), len(r.body))
	}
}

// decodeEventStream decodes every message of body.
func decodeEventStream(t *testing.T, body []byte) []eventstream.Message {
	t.Helper()
	dec := eventstream.NewDecoder()
	rd := bytes.NewReader(body)
	var msgs []eventstream.Message
	for rd.Len() > 0 {
		m, err := dec.Decode(rd, nil)
		if err != nil {
			t.Fatalf("message %d: %v", len(msgs), err)
		}
		msgs = append(msgs, m)
	}
	return msgs
}
