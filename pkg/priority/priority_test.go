package priority_test

import (
	"encoding/json"
	"testing"

	"bulwark/pkg/priority"
)

func TestParse(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		in   string
		want priority.Priority
		ok   bool
	}{
		{"critical", priority.Critical, true}, {"HIGH", priority.High, true}, {" normal ", priority.Normal, true},
		{"low", priority.Low, true}, {"1", priority.Critical, true}, {"4", priority.Low, true}, {"P2", priority.High, true},
		{"p3", priority.Normal, true}, {"0", 0, false}, {"5", 0, false}, {"urgent", 0, false}, {"", 0, false},
	} {
		got, err := priority.Parse(tt.in)
		if (err == nil) != tt.ok || got != tt.want {
			t.Errorf("Parse(%q) = %v, %v; want %v ok=%v", tt.in, got, err, tt.want, tt.ok)
		}
	}
}

func TestJSON(t *testing.T) {
	t.Parallel()
	var v struct{ P priority.Priority }
	for in, want := range map[string]priority.Priority{`{"P":"high"}`: priority.High, `{"P":2}`: priority.High, `{"P":"P4"}`: priority.Low} {
		if err := json.Unmarshal([]byte(in), &v); err != nil || v.P != want {
			t.Errorf("%s: %v %v", in, v.P, err)
		}
	}
	for _, in := range []string{`{"P":9}`, `{"P":"soon"}`, `{"P":true}`} {
		if err := json.Unmarshal([]byte(in), &v); err == nil {
			t.Errorf("%s: accepted", in)
		}
	}
	if b, _ := json.Marshal(struct{ P priority.Priority }{priority.Critical}); string(b) != `{"P":"critical"}` {
		t.Errorf("marshal: %s", b)
	}
}
