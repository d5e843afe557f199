package anthropic

import (
	"fmt"
	"net/http"
	"time"

	"bulwark/pkg/llm"
	"bulwark/pkg/provider/internal/wirejson"
)

// The model list (GET /v1/models), a model (GET /v1/models/{id}) and a
// token count (POST /v1/messages/count_tokens) as Anthropic writes them.

type wireModel struct {
	Type        string    `json:"type"`
	ID          string    `json:"id"`
	DisplayName string    `json:"display_name"`
	CreatedAt   time.Time `json:"created_at"`
	// MaxTokens is the most max_tokens a request for the model may ask.
	MaxTokens int `json:"max_tokens"`
}

type wireModelList struct {
	Data    []wireModel `json:"data"`
	HasMore bool        `json:"has_more"`
	FirstID *string     `json:"first_id"`
	LastID  *string     `json:"last_id"`
}

// modelOf is m as Anthropic lists a model. created_at is the epoch, as
// Anthropic documents for a release date it does not know; the display
// name is the id itself.
func modelOf(m llm.Model) wireModel {
	return wireModel{Type: "model", ID: m.ID, DisplayName: m.ID, CreatedAt: time.Unix(0, 0).UTC(),
		MaxTokens: m.MaxOutputTokens}
}

// EncodeModelList renders one page of models as Anthropic's model list:
// first_id and last_id name its ends (null when it is empty), has_more
// says whether another page follows.
func EncodeModelList(page []llm.Model, hasMore bool) ([]byte, error) {
	out := wireModelList{Data: make([]wireModel, 0, len(page)), HasMore: hasMore}
	for _, m := range page {
		out.Data = append(out.Data, modelOf(m))
	}
	if len(page) > 0 {
		out.FirstID, out.LastID = &page[0].ID, &page[len(page)-1].ID
	}
	return wirejson.Marshal(out)
}

// EncodeModel renders one model as Anthropic's model object.
func EncodeModel(m llm.Model) ([]byte, error) { return wirejson.Marshal(modelOf(m)) }

// EncodeModelNotFound is Anthropic's 404 for a model id it does not know.
func EncodeModelNotFound(id string) []byte {
	return EncodeError(http.StatusNotFound, "", "model: "+id)
}

// EncodeMaxTokensError is Anthropic's 400 for a max_tokens above the
// model's maximum output, worded as Anthropic words it ("max_tokens:
// 64001 > 64000, which is the maximum allowed number of output tokens for
// claude-sonnet-4-5"); model is the name the caller asked for.
func EncodeMaxTokensError(asked, limit int, model string) []byte {
	return EncodeError(http.StatusBadRequest, "", fmt.Sprintf(
		"max_tokens: %d > %d, which is the maximum allowed number of output tokens for %s", asked, limit, model))
}

// EncodeTokenCount renders the answer of count_tokens:
// {"input_tokens": n}.
func EncodeTokenCount(n int) ([]byte, error) {
	return wirejson.Marshal(struct {
		InputTokens int `json:"input_tokens"`
	}{n})
}
