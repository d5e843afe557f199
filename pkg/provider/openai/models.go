package openai

import (
	"fmt"
	"net/http"

	"bulwark/pkg/llm"
	"bulwark/pkg/provider/internal/wirejson"
)

// The model list (GET /v1/models) and a model (GET /v1/models/{id}) as
// OpenAI writes them: {"object":"list","data":[{"id","object":"model",
// "created","owned_by"}]}.

type wireModel struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
}

type wireModelList struct {
	Object string      `json:"object"`
	Data   []wireModel `json:"data"`
}

// modelOf is m as OpenAI lists a model. created is 0: Bulwark does not
// know when a model came out. owned_by is the configured provider the
// name routes to.
func modelOf(m llm.Model) wireModel {
	return wireModel{ID: m.ID, Object: "model", OwnedBy: string(m.Route.Provider)}
}

// EncodeModelList renders models as OpenAI's model list.
func EncodeModelList(models []llm.Model) ([]byte, error) {
	out := wireModelList{Object: "list", Data: make([]wireModel, 0, len(models))}
	for _, m := range models {
		out.Data = append(out.Data, modelOf(m))
	}
	return wirejson.Marshal(out)
}

// EncodeModel renders one model as OpenAI's model object.
func EncodeModel(m llm.Model) ([]byte, error) { return wirejson.Marshal(modelOf(m)) }

// EncodeModelNotFound is OpenAI's 404 for a model id it does not know:
// code model_not_found on param model.
func EncodeModelNotFound(id string) []byte {
	return encodeParamError(http.StatusNotFound, "model_not_found", "model",
		fmt.Sprintf("The model '%s' does not exist", id))
}

// EncodeMaxTokensError is OpenAI's 400 for a max_tokens above the
// model's maximum output, worded as OpenAI words it ("max_tokens is too
// large: 64000. This model supports at most 16384 completion tokens,
// whereas you provided 64000."), on param, the field the caller sent
// (max_tokens or max_completion_tokens); code null, as OpenAI sends it.
func EncodeMaxTokensError(param string, asked, limit int) []byte {
	return encodeParamError(http.StatusBadRequest, "", param, fmt.Sprintf(
		"%s is too large: %d. This model supports at most %d completion tokens, whereas you provided %d.",
		param, asked, limit, asked))
}

// encodeParamError is EncodeError with error.param set.
func encodeParamError(status int, code, param, message string) []byte {
	e := outError{Error: outErrorDetail{Message: message, Type: errorTypeFor(status), Param: &param}}
	if code != "" {
		e.Error.Code = &code
	}
	body, err := wirejson.Marshal(e)
	if err != nil {
		return EncodeError(status, code, message)
	}
	return body
}
