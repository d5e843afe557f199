package mockprovider

// The Bedrock Runtime's InvokeModelWithResponseStream for Claude: POST
// /model/{modelId}/invoke-with-response-stream.
//
// What the mock imitates, and where it comes from:
//
//   - The operation: the same path label, body, signature checks, faults,
//     admission and metering as InvokeModel (bedrock.go), one more path
//     (Amazon Bedrock API Reference, "InvokeModelWithResponseStream").
//   - The answer: status 200, Content-Type
//     application/vnd.amazon.eventstream and x-amzn-RequestId, the body
//     the AWS event-stream encoding (the "Amazon event stream encoding"
//     of the Transcribe and S3 Select developer guides: messages of a
//     prelude with total and headers lengths, its CRC32, typed headers, a
//     payload and the message's CRC32), encoded with the AWS SDK's own
//     eventstream.Encoder. Each event is headers :message-type "event",
//     :event-type "chunk", :content-type "application/json" and the
//     payload {"bytes": "<base64>"} (the ResponseStream union's chunk
//     member, PayloadPart), whose bytes are one event of Anthropic's
//     Messages stream, the same events the Messages endpoint streams
//     (anthropic_stream.go) but for ping, which Bedrock's Claude streams
//     do not forward (the user guide's examples show none).
//   - Pace and faults: the Messages stream's (stream.go). FaultStreamError
//     ends the stream with an exception message: :message-type
//     "exception", :exception-type "modelStreamErrorException" (a
//     ResponseStream member) and {"message": "…"}, as the SDK's event
//     stream reader expects exceptions; FaultStreamCut drops the
//     connection.

import (
	"bytes"
	"net/http"

	"github.com/aws/aws-sdk-go-v2/aws/protocol/eventstream"
)

// bedrockEventStream is the media type of an AWS event stream.
const bedrockEventStream = "application/vnd.amazon.eventstream"

// bedrockModelStreamError is the exception of a stream the model broke off.
const bedrockModelStreamError = "modelStreamErrorException"

// serveBedrockStream answers InvokeModelWithResponseStream: InvokeModel's
// path through serve, with the stream's media type.
func (s *Server) serveBedrockStream(w http.ResponseWriter, r *http.Request) {
	s.serve(&eventStreamResponse{ResponseWriter: w}, r, &bedrockWire{model: r.PathValue("modelId"), stream: true})
}

// eventStreamResponse is a ResponseWriter whose streamed answer (a 200,
// which streamAnswer labels text/event-stream) is labelled as an AWS event
// stream; error answers keep their JSON.
type eventStreamResponse struct {
	http.ResponseWriter
}

func (w *eventStreamResponse) WriteHeader(status int) {
	if status == http.StatusOK {
		w.Header().Set("Content-Type", bedrockEventStream)
		w.Header().Del("Cache-Control")
	}
	w.ResponseWriter.WriteHeader(status)
}

// Unwrap lets http.ResponseController flush the stream.
func (w *eventStreamResponse) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// bedrockScript re-frames sc, a Messages stream, as Bedrock sends it: each
// event's JSON a chunk event, ping left out, and the error event an
// exception message.
func bedrockScript(sc *script) *script {
	out := &script{outputTokens: sc.outputTokens, head: bedrockFrames(sc.head), body: bedrockFrames(sc.body)}
	out.fail = func(message string) frame {
		if message == "" {
			message = "The model stream ended with an error. Try your request again."
		}
		return bedrockException(bedrockModelStreamError, message)
	}
	return out
}

// bedrockFrames re-frames server-sent events, keeping what the pace and
// settling read (content, tokens).
func bedrockFrames(frames []frame) []frame {
	var out []frame
	for _, f := range frames {
		name, data := sseParts(f.data)
		if name == "ping" {
			continue
		}
		out = append(out, frame{data: bedrockChunk(data), content: f.content, tokens: f.tokens})
	}
	return out
}

// sseParts splits "event: <name>\ndata: <json>\n\n", as sseEvent writes it.
func sseParts(ev []byte) (name string, data []byte) {
	head, rest, _ := bytes.Cut(ev, []byte("\n"))
	data, _ = bytes.CutPrefix(bytes.TrimSuffix(rest, []byte("\n\n")), []byte("data: "))
	n, _ := bytes.CutPrefix(head, []byte("event: "))
	return string(n), data
}

// bedrockChunk is a chunk event carrying data, one Anthropic event's JSON.
func bedrockChunk(data []byte) []byte {
	var h eventstream.Headers
	h.Set(":message-type", eventstream.StringValue("event"))
	h.Set(":event-type", eventstream.StringValue("chunk"))
	h.Set(":content-type", eventstream.StringValue("application/json"))
	// encoding/json writes []byte as base64, as the PayloadPart's blob.
	return eventMessage(h, eventJSON(struct {
		Bytes []byte `json:"bytes"`
	}{data}))
}

// bedrockException is an exception message of type typ (a ResponseStream
// member name) saying message.
func bedrockException(typ, message string) frame {
	var h eventstream.Headers
	h.Set(":message-type", eventstream.StringValue("exception"))
	h.Set(":exception-type", eventstream.StringValue(typ))
	h.Set(":content-type", eventstream.StringValue("application/json"))
	return frame{data: eventMessage(h, eventJSON(bedrockErrorBody{Message: message}))}
}

// eventMessage encodes one event-stream message.
func eventMessage(h eventstream.Headers, payload []byte) []byte {
	var b bytes.Buffer
	if err := eventstream.NewEncoder().Encode(&b, eventstream.Message{Headers: h, Payload: payload}); err != nil {
		panic("mockprovider: encoding an event-stream message: " + err.Error()) // a bug in the mock
	}
	return b.Bytes()
}
