package httpapi_test

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/gin-gonic/gin"

	"bulwark/pkg/httpapi"
)

// undocumented are the routes gin registers that the description leaves
// out on purpose, by method and path as gin names them.
var undocumented = map[string]string{
	// asynqmon's own assets and JSON API under the dashboard: a mounted
	// third-party UI whose paths (a catch-all) OpenAPI cannot template and
	// whose API is asynqmon's, not Bulwark's. GET /admin/queues, the page
	// itself, is described.
	"/admin/queues/*path": "any method",
	// Go's runtime profiles (net/http/pprof, read by `go tool pprof`):
	// a standard tool's pages, not part of Bulwark's API.
	"/admin/debug/pprof/*path": "GET",
}

// spec is the parsed description.
func spec(t *testing.T) map[string]any {
	t.Helper()
	var doc map[string]any
	dec := json.NewDecoder(bytes.NewReader(httpapi.OpenAPI()))
	dec.UseNumber()
	if err := dec.Decode(&doc); err != nil {
		t.Fatalf("openapi.json does not parse: %v", err)
	}
	return doc
}

// pointer resolves a local JSON pointer ("#/components/schemas/X").
func pointer(doc map[string]any, ref string) (any, bool) {
	rest, ok := strings.CutPrefix(ref, "#/")
	if !ok {
		return nil, false
	}
	var cur any = doc
	for _, tok := range strings.Split(rest, "/") {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		m, ok := cur.(map[string]any)
		if !ok {
			return nil, false
		}
		if cur, ok = m[tok]; !ok {
			return nil, false
		}
	}
	return cur, true
}

// deref follows $ref until an object without one.
func deref(t *testing.T, doc map[string]any, v any) map[string]any {
	t.Helper()
	m, _ := v.(map[string]any)
	for i := 0; m != nil && i < 10; i++ {
		ref, ok := m["$ref"].(string)
		if !ok {
			return m
		}
		target, ok := pointer(doc, ref)
		if !ok {
			t.Fatalf("unresolved $ref %s", ref)
		}
		m, _ = target.(map[string]any)
	}
	return m
}

var methods = []string{"get", "put", "post", "delete", "options", "head", "patch", "trace"}

// operations lists the described operations as "METHOD path".
func operations(doc map[string]any) map[string]map[string]any {
	out := map[string]map[string]any{}
	paths, _ := doc["paths"].(map[string]any)
	for p, item := range paths {
		for _, m := range methods {
			if op, ok := item.(map[string]any)[m].(map[string]any); ok {
				out[strings.ToUpper(m)+" "+p] = op
			}
		}
	}
	return out
}

// The description is an OpenAPI 3.1 document whose references all
// resolve, whose operations are complete and whose path parameters match
// their templates.
func TestOpenAPIDocument(t *testing.T) {
	doc := spec(t)
	if v, _ := doc["openapi"].(string); !strings.HasPrefix(v, "3.1.") {
		t.Fatalf("openapi %q, want 3.1.x", v)
	}
	info, _ := doc["info"].(map[string]any)
	if info["title"] == nil || info["version"] == nil {
		t.Fatalf("info lacks title or version: %v", info)
	}

	// Every $ref anywhere resolves.
	refs := 0
	var walk func(where string, v any)
	walk = func(where string, v any) {
		switch x := v.(type) {
		case map[string]any:
			if ref, ok := x["$ref"].(string); ok {
				refs++
				if _, ok := pointer(doc, ref); !ok {
					t.Errorf("%s: $ref %s does not resolve", where, ref)
				}
			}
			for k, e := range x {
				walk(where+"/"+k, e)
			}
		case []any:
			for _, e := range x {
				walk(where+"[]", e)
			}
		}
	}
	walk("#", doc)
	if refs == 0 {
		t.Fatal("no $ref at all: the walk is broken")
	}

	schemes, _ := pointer(doc, "#/components/securitySchemes")
	ids := map[string]string{}
	template := regexp.MustCompile(`\{([^}]+)\}`)
	paths, _ := doc["paths"].(map[string]any)
	for key, op := range operations(doc) {
		id, _ := op["operationId"].(string)
		if id == "" {
			t.Errorf("%s: no operationId", key)
		} else if other, dup := ids[id]; dup {
			t.Errorf("%s: operationId %s also used by %s", key, id, other)
		}
		ids[id] = key
		resps, _ := op["responses"].(map[string]any)
		if len(resps) == 0 {
			t.Errorf("%s: no responses", key)
		}
		for code, r := range resps {
			resp := deref(t, doc, r)
			if d, _ := resp["description"].(string); d == "" {
				t.Errorf("%s %s: response without description", key, code)
			}
			content, _ := resp["content"].(map[string]any)
			for mt, media := range content {
				if _, sse := media.(map[string]any)["x-sse-events"]; sse != (mt == "text/event-stream") {
					t.Errorf("%s %s %s: x-sse-events belongs to text/event-stream, and there always", key, code, mt)
				}
			}
		}
		for _, req := range asSlice(op["security"]) {
			for name := range req.(map[string]any) {
				if _, ok := schemes.(map[string]any)[name]; !ok {
					t.Errorf("%s: unknown security scheme %s", key, name)
				}
			}
		}
		// Path parameters: declared on the path or the operation, each
		// named in the template, each of the template's declared.
		path := strings.SplitN(key, " ", 2)[1]
		declared := map[string]bool{}
		for _, p := range append(asSlice(paths[path].(map[string]any)["parameters"]), asSlice(op["parameters"])...) {
			prm := deref(t, doc, p)
			if prm["in"] == "path" {
				if prm["required"] != true {
					t.Errorf("%s: path parameter %v not required", key, prm["name"])
				}
				declared[prm["name"].(string)] = true
			}
		}
		for _, m := range template.FindAllStringSubmatch(path, -1) {
			if !declared[m[1]] {
				t.Errorf("%s: path parameter {%s} not declared", key, m[1])
			}
			delete(declared, m[1])
		}
		for name := range declared {
			t.Errorf("%s: parameter %s is not in the path", key, name)
		}
		// The tenants' and the operators' endpoints (/metrics among them)
		// need a token; /readyz takes the admin token for its details
		// (an empty requirement first: optional); the others none.
		sec := asSlice(op["security"])
		needsToken := strings.HasPrefix(path, "/v1/") || strings.HasPrefix(path, "/admin/") || path == "/metrics"
		switch {
		case path == "/readyz":
			if len(sec) < 2 || len(asMap(sec[0])) != 0 {
				t.Errorf("%s: security %v; want optional admin auth", key, op["security"])
			}
		case needsToken != (len(sec) > 0):
			t.Errorf("%s: security %v", key, op["security"])
		}
	}
}

func asSlice(v any) []any {
	s, _ := v.([]any)
	return s
}

// Fakes that satisfy the collaborators' interfaces: building the routes
// calls none of them.
type (
	fakeJobs     struct{ httpapi.Jobs }
	fakeQueue    struct{ httpapi.Queue }
	fakeHistory  struct{ httpapi.History }
	fakeKeys     struct{ httpapi.KeyAdmin }
	fakeBreakers struct{ httpapi.BreakerAdmin }
	fakeCache    struct{ httpapi.CacheAdmin }
	fakeReporter struct{ httpapi.Reporter }
	fakeModels   struct{ httpapi.Models }
)

// handlers builds the API with every optional part configured, so that
// every endpoint is registered.
func handlers(apart bool) (api, admin http.Handler) {
	return httpapi.New(httpapi.Config{AdminApart: apart}, httpapi.Deps{
		Jobs: fakeJobs{}, Queue: fakeQueue{}, History: fakeHistory{},
		Keys: fakeKeys{}, Breakers: fakeBreakers{}, Cache: fakeCache{}, Reporter: fakeReporter{},
		Models: fakeModels{}, Metrics: http.NotFoundHandler(), Queues: http.NotFoundHandler(),
		Logger: slog.New(slog.DiscardHandler),
	})
}

// routes lists what gin registered on h as "METHOD path", in OpenAPI's
// path syntax ({id} for :id), leaving out the undocumented ones.
func routes(t *testing.T, h http.Handler) map[string]bool {
	t.Helper()
	e, ok := h.(*gin.Engine)
	if !ok {
		t.Fatalf("handler is a %T, not a *gin.Engine", h)
	}
	param := regexp.MustCompile(`:([A-Za-z_]+)`)
	out := map[string]bool{}
	for _, r := range e.Routes() {
		if _, skip := undocumented[r.Path]; skip {
			continue
		}
		out[r.Method+" "+param.ReplaceAllString(r.Path, "{$1}")] = true
	}
	return out
}

// Every route gin registers is described and every described operation is
// registered, with the admin endpoints beside the tenants' ones or on a
// listener of their own; /openapi.json is served on the tenants' listener.
func TestOpenAPIRoutes(t *testing.T) {
	documented := map[string]bool{}
	for key := range operations(spec(t)) {
		documented[key] = true
	}
	compare := func(what string, got map[string]bool) {
		t.Helper()
		for key := range got {
			if !documented[key] {
				t.Errorf("%s: route %s is not in openapi.json", what, key)
			}
		}
		for key := range documented {
			if !got[key] {
				t.Errorf("%s: openapi.json describes %s, which is not registered", what, key)
			}
		}
	}

	together, none := handlers(false)
	if none != nil {
		t.Fatal("an admin handler without AdminApart")
	}
	compare("one listener", routes(t, together))

	api, admin := handlers(true)
	apiRoutes, adminRoutes := routes(t, api), routes(t, admin)
	union := map[string]bool{}
	for key := range apiRoutes {
		union[key] = true
		if strings.Contains(key, " /admin") {
			t.Errorf("admin apart: %s on the tenants' listener", key)
		}
	}
	for key := range adminRoutes {
		union[key] = true
		path := strings.SplitN(key, " ", 2)[1]
		if !strings.HasPrefix(path, "/admin/") && !slices.Contains([]string{"/healthz", "/readyz", "/metrics"}, path) {
			t.Errorf("admin apart: %s on the admin listener", key)
		}
	}
	compare("admin apart", union)
	if adminRoutes["GET /openapi.json"] {
		t.Error("admin apart: /openapi.json on the admin listener")
	}

	for name, h := range map[string]http.Handler{"one listener": together, "admin apart": api} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/openapi.json", nil))
		body, _ := io.ReadAll(rec.Body)
		if rec.Code != http.StatusOK || rec.Header().Get("Content-Type") != "application/json" || !bytes.Equal(body, httpapi.OpenAPI()) {
			t.Errorf("%s: GET /openapi.json: %d %q, %d bytes", name, rec.Code, rec.Header().Get("Content-Type"), len(body))
		}
	}
}

func asMap(v any) map[string]any {
	m, _ := v.(map[string]any)
	return m
}
