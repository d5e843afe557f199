package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"bulwark/pkg/job"
	"bulwark/pkg/llm"
)

// The Responses API lets a client name an earlier answer's output item
// instead of sending it again ({"type":"item_reference","id":"msg_…"}); the
// AI SDK does so for every earlier assistant turn unless told store: false.
// Bulwark stores no conversations, but each answer it gave is still its
// request's record (and then its history row), and the items of a
// response it wrote are named after that request ("msg_<request id>_<i>",
// "fc_<request id>_<i>": openai.itemID), so a reference to one of the
// tenant's own answers is resolved from there: the body is rewritten with
// the item itself before it is decoded, and the wire decoder stays pure.

// errUnknownItem is a reference to no answer the tenant can read.
var errUnknownItem = errors.New("not an output item of one of this tenant's answers (or it has expired: send the item itself)")

// resolveItemRefs returns body with each item_reference of its input
// replaced by the output item it names, read for tenant; body unchanged
// when it has none.
func (s *Server) resolveItemRefs(ctx context.Context, tenant string, body []byte) ([]byte, error) {
	if !bytes.Contains(body, []byte(`"id"`)) {
		return body, nil // no item names anything
	}
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(body, &doc); err != nil {
		return body, nil // the decoder says what is wrong
	}
	var input []json.RawMessage
	if err := json.Unmarshal(doc["input"], &input); err != nil {
		return body, nil // a string, or malformed: the decoder's business
	}
	changed := false
	for i, raw := range input {
		// "type" is optional on a reference (openai-go leaves it out): an
		// item with an id and neither a role nor content is one.
		var ref struct {
			Type, ID, Role string
			Content        json.RawMessage
		}
		if json.Unmarshal(raw, &ref) != nil || ref.ID == "" ||
			!(ref.Type == "item_reference" || ref.Type == "" && ref.Role == "" && ref.Content == nil) {
			continue
		}
		item, err := s.outputItem(ctx, tenant, ref.ID)
		if err != nil {
			return nil, fmt.Errorf("input[%d].id: %q is %w", i, ref.ID, err)
		}
		input[i], changed = item, true
	}
	if !changed {
		return body, nil
	}
	var err error
	if doc["input"], err = json.Marshal(input); err != nil {
		return nil, err
	}
	return json.Marshal(doc)
}

// outputItem is the Responses input item of output item id: an assistant
// message of its text, or its function call.
func (s *Server) outputItem(ctx context.Context, tenant, id string) (json.RawMessage, error) {
	reqID, index, ok := parseItemID(id)
	if !ok {
		return nil, errUnknownItem
	}
	resp := s.answerOf(ctx, tenant, reqID)
	if resp == nil || index >= len(resp.Content) {
		return nil, errUnknownItem
	}
	b := resp.Content[index]
	switch b.Type {
	case llm.BlockText:
		return json.Marshal(map[string]any{"type": "message", "role": "assistant",
			"content": []map[string]any{{"type": "output_text", "text": b.Text}}})
	case llm.BlockToolUse:
		return json.Marshal(map[string]any{"type": "function_call", "call_id": b.ToolUseID, "name": b.ToolName,
			"arguments": string(b.Input)})
	}
	return nil, errUnknownItem
}

// parseItemID splits "msg_<request id>_<i>" or "fc_<request id>_<i>".
func parseItemID(id string) (reqID string, index int, ok bool) {
	rest, found := strings.CutPrefix(id, "msg_")
	if !found {
		if rest, found = strings.CutPrefix(id, "fc_"); !found {
			return "", 0, false
		}
	}
	cut := strings.LastIndexByte(rest, '_')
	if cut <= 0 {
		return "", 0, false
	}
	n, err := strconv.Atoi(rest[cut+1:])
	if err != nil || n < 0 {
		return "", 0, false
	}
	return rest[:cut], n, true
}

// answerOf is request id's answer if it is the tenant's and completed:
// from its record, or from history once the record expired.
func (s *Server) answerOf(ctx context.Context, tenant, id string) *llm.Response {
	if rec, err := s.d.Jobs.Get(ctx, id); err == nil {
		if rec.Job.Tenant != tenant || rec.Status != job.StatusCompleted {
			return nil
		}
		return rec.State.Result
	}
	if s.d.History == nil {
		return nil
	}
	row, err := s.d.History.Get(ctx, id)
	if err != nil || row.Tenant != tenant || row.Status != job.StatusCompleted {
		return nil
	}
	return row.Response
}
