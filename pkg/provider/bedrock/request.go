package bedrock

import (
	"encoding/json"
	"fmt"

	"bulwark/pkg/llm"
	"bulwark/pkg/provider/anthropic"
	"bulwark/pkg/provider/internal/wirejson"
)

// EncodeRequest renders req as an InvokeModel body for a Claude model:
// Anthropic's Messages request (anthropic.EncodeRequest, with its defaults
// and clamps) without "model", which Bedrock takes from the path and
// refuses in the body, and with "anthropic_version" set to version
// (AnthropicVersionDefault when empty). req.Model must still be set: it is
// the path's model id. Bedrock refuses "stream" too; EncodeRequest never
// writes one (InvokeModel does not stream).
func EncodeRequest(req *llm.Request, version string) ([]byte, error) {
	if version == "" {
		version = AnthropicVersionDefault
	}
	msg, err := anthropic.EncodeRequest(req)
	if err != nil {
		return nil, fmt.Errorf("bedrock: %w", err)
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(msg, &fields); err != nil {
		// anthropic.EncodeRequest writes an object; this is a bug.
		return nil, fmt.Errorf("bedrock: encode request: %w", err)
	}
	delete(fields, "model")
	delete(fields, "stream")
	v, err := json.Marshal(version)
	if err != nil {
		return nil, fmt.Errorf("bedrock: encode request: %w", err)
	}
	fields["anthropic_version"] = v
	body, err := wirejson.Marshal(fields)
	if err != nil {
		return nil, fmt.Errorf("bedrock: encode request: %w", err)
	}
	return body, nil
}
