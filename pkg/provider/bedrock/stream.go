package bedrock

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws/protocol/eventstream"
	"github.com/aws/aws-sdk-go-v2/aws/protocol/eventstream/eventstreamapi"
	"github.com/aws/smithy-go/encoding/httpbinding"

	"bulwark/pkg/llm"
	"bulwark/pkg/provider"
	"bulwark/pkg/provider/anthropic"
)

// EventStreamContentType is the media type of an AWS event stream, the
// body of an InvokeModelWithResponseStream answer.
const EventStreamContentType = "application/vnd.amazon.eventstream"

var _ llm.Streamer = (*Client)(nil)

// StreamPath is the InvokeModelWithResponseStream path of model:
// /model/{modelId}/invoke-with-response-stream, the id escaped as in
// InvokePath.
func StreamPath(model string) string {
	return "/model/" + httpbinding.EscapePath(model, true) + "/invoke-with-response-stream"
}

// Stream is Complete with the answer streamed (see llm.Streamer), through
// InvokeModelWithResponseStream: the same body and signature, Accept
// application/vnd.amazon.eventstream, and ReadStream reading the answer.
// Failures are Complete's until the stream starts; after that, an
// exception message is classified by the same table as the error type it
// names (throttlingException as ThrottlingException: rate_limited;
// modelStreamErrorException, internalServerException: transient;
// serviceUnavailableException: overloaded; validationException:
// permanent), and a stream that breaks off, is malformed, or outlasts
// Config.Timeout is a transient *llm.Error. When ctx ends first, the error
// wraps ctx's error and is not an *llm.Error.
func (c *Client) Stream(ctx context.Context, cred llm.Credential, req *llm.Request, emit func(llm.Delta)) (*llm.Result, error) {
	call, w, err := c.call(ctx, cred, req, StreamPath(req.Model), EventStreamContentType)
	if err != nil {
		return nil, err
	}
	return provider.DoStream(ctx, c.hc, call, w, emit)
}

// ReadStream reads an InvokeModelWithResponseStream answer, an AWS event
// stream (decoded, CRCs checked, by the AWS SDK's eventstream package),
// into the answer anthropic.DecodeResponse would have made of the same
// message, calling emit with each delta as it arrives. Each "chunk" event
// carries {"bytes": "<base64>"}, one event of Anthropic's Messages stream,
// which anthropic.StreamReader reads; other event types are ignored. An
// exception message (or an error message) is a *provider.ErrorEvent whose
// body is Bedrock's error JSON ({"__type": "ThrottlingException",
// "message": …}), so that the adapter's error table reads it as it reads
// an error answer. A stream that ends before message_stop, or a message
// that does not decode, is an error.
func ReadStream(body io.Reader, emit func(llm.Delta)) (*llm.Response, error) {
	dec := eventstream.NewDecoder()
	events := anthropic.NewStreamReader(emit)
	var buf []byte
	for {
		msg, err := dec.Decode(body, buf)
		if errors.Is(err, io.EOF) {
			return nil, errors.New("bedrock: read stream: the stream ended before message_stop")
		}
		if err != nil {
			return nil, fmt.Errorf("bedrock: read stream: %w", err)
		}
		done, err := readMessage(events, msg)
		if err != nil {
			return nil, err
		}
		if done {
			return events.Response()
		}
		buf = msg.Payload[:0] // read, so its bytes may carry the next payload
	}
}

// payloadPart is a chunk event's payload: the model's bytes, base64 in
// the JSON.
type payloadPart struct {
	Bytes []byte `json:"bytes"`
}

// readMessage reads one event-stream message into events; done reports
// Anthropic's message_stop.
func readMessage(events *anthropic.StreamReader, msg eventstream.Message) (done bool, err error) {
	switch typ := header(msg, eventstreamapi.MessageTypeHeader); typ {
	case eventstreamapi.EventMessageType:
		if header(msg, eventstreamapi.EventTypeHeader) != "chunk" {
			return false, nil // an event type added later
		}
		var part payloadPart
		if err := json.Unmarshal(msg.Payload, &part); err != nil {
			return false, fmt.Errorf("bedrock: read stream: chunk: %w", err)
		}
		return events.Event("", part.Bytes)
	case eventstreamapi.ExceptionMessageType:
		var w wireError
		_ = json.Unmarshal(msg.Payload, &w) // a payload that is not JSON has no message
		return false, errorEvent(header(msg, eventstreamapi.ExceptionTypeHeader), w.Message)
	case eventstreamapi.ErrorMessageType:
		return false, errorEvent(header(msg, eventstreamapi.ErrorCodeHeader), header(msg, eventstreamapi.ErrorMessageHeader))
	default:
		return false, fmt.Errorf("bedrock: read stream: a message of type %q", provider.Redact(typ))
	}
}

// header is msg's header name as a string, "" when it has none.
func header(msg eventstream.Message, name string) string {
	v := msg.Headers.Get(name)
	if v == nil {
		return ""
	}
	return v.String()
}

// errorEvent is the *provider.ErrorEvent of an exception of type typ (the
// stream's member name, "throttlingException") saying message: Bedrock's
// error JSON with the type as an error answer names it
// ("ThrottlingException"), for errorOf.
func errorEvent(typ, message string) error {
	body, err := json.Marshal(wireError{Type: exceptionName(typ), Message: message})
	if err != nil {
		return fmt.Errorf("bedrock: read stream: exception: %w", err)
	}
	return &provider.ErrorEvent{Body: body}
}

// exceptionName is the error type of an exception member: its first letter
// upper-cased, as the SDK's types name them.
func exceptionName(member string) string {
	member = strings.TrimSpace(member)
	r, size := utf8.DecodeRuneInString(member)
	if size == 0 {
		return ""
	}
	return string(unicode.ToUpper(r)) + member[size:]
}
