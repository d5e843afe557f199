package httpapi

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/gin-gonic/gin"

	"bulwark/pkg/intake"
	"bulwark/pkg/llm"
	"bulwark/pkg/provider/anthropic"
	"bulwark/pkg/provider/openai"
)

// GET /v1/models and GET /v1/models/{id} list the model names the compat
// endpoints accept (Models.List: aliases, tiers' model names,
// "provider/tier"), every tenant the same, in the caller's dialect:
// Anthropic's when the request carries anthropic-version (its SDKs always
// send it), OpenAI's otherwise. A name with a slash is one path segment
// escaped (claude%2Fsonnet), as both SDKs send it.
//
// POST /v1/messages/count_tokens answers Anthropic's token count from
// Bulwark's own estimate (intake.InputTokens, what the key pool meters),
// without a provider call or a place in the queue.

// anthropicModels reports whether a /v1/models request speaks Anthropic's
// dialect.
func anthropicModels(r *http.Request) bool { return r.Header.Get("anthropic-version") != "" }

// modelsError answers a /v1/models request's error in its dialect.
func modelsError(c *gin.Context, status int, code, msg string) {
	if anthropicModels(c.Request) {
		anthropicError(c, status, code, msg)
		return
	}
	openAIError(c, status, code, msg)
}

func (s *Server) listModels(c *gin.Context) {
	models := s.d.Models.List()
	if !anthropicModels(c.Request) {
		body, err := openai.EncodeModelList(models)
		writeEncoded(c, body, err)
		return
	}
	page, more, err := modelPage(models, c.Query("limit"), c.Query("after_id"), c.Query("before_id"))
	if err != nil {
		anthropicError(c, http.StatusBadRequest, "", err.Error())
		return
	}
	body, err := anthropic.EncodeModelList(page, more)
	writeEncoded(c, body, err)
}

func (s *Server) getModel(c *gin.Context) {
	id := c.Param("id")
	models := s.d.Models.List()
	i, ok := slices.BinarySearchFunc(models, id, func(m llm.Model, id string) int { return strings.Compare(m.ID, id) })
	switch {
	case !ok && anthropicModels(c.Request):
		c.Data(http.StatusNotFound, "application/json", anthropic.EncodeModelNotFound(id))
	case !ok:
		c.Data(http.StatusNotFound, "application/json", openai.EncodeModelNotFound(id))
	case anthropicModels(c.Request):
		body, err := anthropic.EncodeModel(models[i])
		writeEncoded(c, body, err)
	default:
		body, err := openai.EncodeModel(models[i])
		writeEncoded(c, body, err)
	}
}

// Anthropic's page sizes (its list endpoints' limit: default 20, 1-1000).
const (
	modelPageDefault = 20
	modelPageMax     = 1000
)

// modelPage is one page of models (sorted by id) as Anthropic pages its
// list: at most limit of them, those after afterID or, with beforeID, the
// last ones before it; more says whether others lie beyond the page in
// that direction. An id need not be a listed one: the page starts where
// it would sort.
func modelPage(models []llm.Model, limit, afterID, beforeID string) (page []llm.Model, more bool, err error) {
	n := modelPageDefault
	if limit != "" {
		if n, err = strconv.Atoi(limit); err != nil || n < 1 || n > modelPageMax {
			return nil, false, fmt.Errorf("limit: must be between 1 and %d, got %q", modelPageMax, limit)
		}
	}
	if afterID != "" && beforeID != "" {
		return nil, false, errors.New("after_id and before_id: give one or the other")
	}
	at := func(id string) int {
		i, _ := slices.BinarySearchFunc(models, id, func(m llm.Model, id string) int { return strings.Compare(m.ID, id) })
		return i
	}
	if beforeID != "" {
		end := at(beforeID)
		start := max(0, end-n)
		return models[start:end], start > 0, nil
	}
	start := 0
	if afterID != "" {
		start = at(afterID)
		if start < len(models) && models[start].ID == afterID {
			start++
		}
	}
	end := min(len(models), start+n)
	return models[start:end], end < len(models), nil
}

// writeEncoded writes an encoded JSON answer, or a 500 if it did not
// encode.
func writeEncoded(c *gin.Context, body []byte, err error) {
	if err != nil {
		routeError(c, http.StatusInternalServerError, "encode_failed", "could not encode the answer")
		return
	}
	c.Data(http.StatusOK, "application/json", body)
}

// countTokens is POST /v1/messages/count_tokens: the request is decoded
// and validated as POST /v1/messages would (the same 4xx), then its input
// tokens estimated.
func (s *Server) countTokens(c *gin.Context) {
	d := anthropicDialect
	body, ok := s.readBody(c, d)
	if !ok {
		return
	}
	info, req, err := anthropic.DecodeCountTokensRequest(body)
	if err != nil {
		d.fail(c, http.StatusBadRequest, "invalid_request", err.Error())
		return
	}
	route, ok := s.d.Models.Resolve(info.Model)
	if !ok {
		d.fail(c, http.StatusNotFound, "model_not_found", "unknown model "+strconv.Quote(info.Model))
		return
	}
	r := *req
	r.Model = ""
	n, err := s.d.Intake.InputTokens(intake.Submission{Route: route, Request: r})
	if err != nil {
		s.compatSubmitError(c, d, answering{model: info.Model}, err)
		return
	}
	out, err := anthropic.EncodeTokenCount(n)
	writeEncoded(c, out, err)
}
