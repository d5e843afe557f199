package metrics

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"gopkg.in/yaml.v3"
)

// The deploy files live at the repository root; tests run in the package
// folder.
var (
	prometheusDir  = filepath.Join("..", "..", "deploy", "prometheus")
	alertsFile     = filepath.Join(prometheusDir, "alerts.yml")
	alertsTestFile = filepath.Join(prometheusDir, "alerts_test.yml")
	configFile     = filepath.Join(prometheusDir, "prometheus.yml")
	dashboardFile  = filepath.Join("..", "..", "deploy", "grafana", "bulwark.json")
)

// promtool runs promtool with args and fails the test with its output when
// it fails. A missing promtool is a failure, not a skip: `make test`
// installs it (Debian package prometheus), and a skipped check would let
// broken rules land.
func promtool(t *testing.T, args ...string) {
	t.Helper()
	path, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatalf("promtool not found on PATH (%v): install Debian's prometheus package (apt-get install prometheus) or run `make test`, which does", err)
	}
	out, err := exec.Command(path, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

func TestPromtoolCheckRules(t *testing.T) {
	t.Parallel()
	promtool(t, "check", "rules", alertsFile)
}

func TestPromtoolTestRules(t *testing.T) {
	t.Parallel()
	promtool(t, "test", "rules", alertsTestFile)
}

// The sample configuration is checked whole (rule files included), with
// the admin token file its api job names made in a temporary directory:
// promtool refuses a credentials_file that does not exist.
func TestPromtoolCheckConfig(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile(configFile)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(raw), adminTokenFile) {
		t.Fatalf("%s: the api job does not send the admin token from %s", configFile, adminTokenFile)
	}
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "bulwark-admin-token")
	alerts, err := os.ReadFile(alertsFile)
	if err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string][]byte{
		"prometheus.yml":      []byte(strings.ReplaceAll(string(raw), adminTokenFile, tokenFile)),
		"alerts.yml":          alerts,
		"bulwark-admin-token": []byte("token\n"),
	} {
		if err := os.WriteFile(filepath.Join(dir, name), body, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	promtool(t, "check", "config", filepath.Join(dir, "prometheus.yml"))
}

// adminTokenFile is where the sample configuration reads the admin token
// that the api's /metrics wants.
const adminTokenFile = "/etc/prometheus/bulwark-admin-token"

// alertRule is the part of a Prometheus alerting rule the tests read.
type alertRule struct {
	Alert       string            `yaml:"alert"`
	Expr        string            `yaml:"expr"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

func readAlerts(t *testing.T) []alertRule {
	t.Helper()
	b, err := os.ReadFile(alertsFile)
	if err != nil {
		t.Fatalf("read alerts: %v", err)
	}
	var f struct {
		Groups []struct {
			Rules []alertRule `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatalf("parse %s: %v", alertsFile, err)
	}
	var rules []alertRule
	for _, g := range f.Groups {
		rules = append(rules, g.Rules...)
	}
	if len(rules) == 0 {
		t.Fatalf("%s has no rules", alertsFile)
	}
	return rules
}

// dashboardExpr is one PromQL expression of the dashboard, with the panel
// it belongs to.
type dashboardExpr struct {
	panel string
	expr  string
}

// readDashboard parses the dashboard and returns it with every "expr" in
// it, wherever it is nested (rows, panels, targets).
func readDashboard(t *testing.T) (map[string]any, []dashboardExpr) {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatalf("read dashboard: %v", err)
	}
	var dash map[string]any
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("%s is not valid JSON: %v", dashboardFile, err)
	}
	var exprs []dashboardExpr
	var walk func(v any, panel string)
	walk = func(v any, panel string) {
		switch v := v.(type) {
		case map[string]any:
			if title, ok := v["title"].(string); ok {
				panel = title
			}
			if e, ok := v["expr"].(string); ok {
				exprs = append(exprs, dashboardExpr{panel: panel, expr: e})
			}
			for _, c := range v {
				walk(c, panel)
			}
		case []any:
			for _, c := range v {
				walk(c, panel)
			}
		}
	}
	walk(dash["panels"], "")
	if len(exprs) == 0 {
		t.Fatalf("%s has no panel expressions", dashboardFile)
	}
	return dash, exprs
}

var metricName = regexp.MustCompile(`\bbulwark_[a-zA-Z0-9_:]+`)

// metricNames returns the bulwark_ metric names an expression uses.
func metricNames(expr string) []string {
	return metricName.FindAllString(expr, -1)
}

// knownFamily reports whether name is a series name of the registry's
// families: a family name itself, or a histogram's _bucket, _sum or
// _count.
func knownFamily(fams map[string]*dto.MetricFamily, name string) bool {
	if _, ok := fams[name]; ok {
		return true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		base, ok := strings.CutSuffix(name, suffix)
		if !ok {
			continue
		}
		if mf, ok := fams[base]; ok && mf.GetType() == dto.MetricType_HISTOGRAM {
			return true
		}
	}
	return false
}

func TestAlertAndDashboardMetricsExist(t *testing.T) {
	t.Parallel()
	reg, _ := fullRegistry(t)
	fams := gather(t, reg)

	for _, r := range readAlerts(t) {
		names := metricNames(r.Expr)
		if len(names) == 0 {
			t.Errorf("alert %s uses no bulwark_ metric: %s", r.Alert, r.Expr)
		}
		for _, n := range names {
			if !knownFamily(fams, n) {
				t.Errorf("alert %s uses %s, which the registry does not have", r.Alert, n)
			}
		}
	}
	_, exprs := readDashboard(t)
	for _, e := range exprs {
		names := metricNames(e.expr)
		if len(names) == 0 {
			t.Errorf("panel %q: expression uses no bulwark_ metric: %s", e.panel, e.expr)
		}
		for _, n := range names {
			if !knownFamily(fams, n) {
				t.Errorf("panel %q uses %s, which the registry does not have", e.panel, n)
			}
		}
	}
}

// TestKnownFamilyRejectsUnknown keeps the check above honest: a misspelt
// name or a histogram suffix on a counter must not pass.
func TestKnownFamilyRejectsUnknown(t *testing.T) {
	t.Parallel()
	reg, _ := fullRegistry(t)
	fams := gather(t, reg)
	for _, name := range []string{"bulwark_queue_dept", "bulwark_requests_total_bucket", "bulwark_provider_calls"} {
		if knownFamily(fams, name) {
			t.Errorf("knownFamily(%q) = true, want false", name)
		}
	}
	for _, name := range []string{"bulwark_request_duration_seconds_bucket", "bulwark_provider_latency_seconds_count", "bulwark_breaker_state"} {
		if !knownFamily(fams, name) {
			t.Errorf("knownFamily(%q) = false, want true", name)
		}
	}
}

func TestAlertsHaveSeverityAndAnnotations(t *testing.T) {
	t.Parallel()
	for _, r := range readAlerts(t) {
		if s := r.Labels["severity"]; !slices.Contains([]string{"info", "warning", "critical"}, s) {
			t.Errorf("alert %s: severity %q, want info, warning or critical", r.Alert, s)
		}
		for _, a := range []string{"summary", "description"} {
			if strings.TrimSpace(r.Annotations[a]) == "" {
				t.Errorf("alert %s has no %s annotation", r.Alert, a)
			}
		}
	}
}

// TestEveryAlertIsUnitTested: each alert must appear in alerts_test.yml at
// least once firing and once not.
func TestEveryAlertIsUnitTested(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(alertsTestFile)
	if err != nil {
		t.Fatalf("read alert tests: %v", err)
	}
	var f struct {
		Tests []struct {
			AlertRuleTest []struct {
				Alertname string           `yaml:"alertname"`
				ExpAlerts []map[string]any `yaml:"exp_alerts"`
			} `yaml:"alert_rule_test"`
		} `yaml:"tests"`
	}
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatalf("parse %s: %v", alertsTestFile, err)
	}
	fires, quiet := map[string]bool{}, map[string]bool{}
	for _, tc := range f.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname] = true
			} else {
				quiet[a.Alertname] = true
			}
		}
	}
	for _, r := range readAlerts(t) {
		if !fires[r.Alert] {
			t.Errorf("alert %s has no test in which it fires", r.Alert)
		}
		if !quiet[r.Alert] {
			t.Errorf("alert %s has no test in which it stays quiet", r.Alert)
		}
	}
}

// TestDashboardCoversAlerts: every metric an alert uses is on the
// dashboard, together with the other quantities the design asks for.
func TestDashboardCoversAlerts(t *testing.T) {
	t.Parallel()
	_, exprs := readDashboard(t)
	onDashboard := map[string]bool{}
	for _, e := range exprs {
		for _, n := range metricNames(e.expr) {
			onDashboard[n] = true
		}
	}
	want := []string{
		NameSlotsInUse, NameTokens, NameCostUSD, NameFallbacks, NameCoalesced,
		NameKeysTotal, NameQueueOldestWait,
	}
	for _, r := range readAlerts(t) {
		want = append(want, metricNames(r.Expr)...)
	}
	for _, n := range want {
		if !onDashboard[n] {
			t.Errorf("%s is not on the dashboard", n)
		}
	}
}

// TestDashboardDatasourceIsVariable: the dashboard imports into any
// Grafana, whatever its Prometheus data source is called.
func TestDashboardDatasourceIsVariable(t *testing.T) {
	t.Parallel()
	dash, _ := readDashboard(t)

	templating, _ := dash["templating"].(map[string]any)
	list, _ := templating["list"].([]any)
	found := false
	for _, v := range list {
		v, _ := v.(map[string]any)
		if v["name"] == "datasource" && v["type"] == "datasource" && v["query"] == "prometheus" {
			found = true
		}
	}
	if !found {
		t.Fatal(`dashboard has no templating variable {"name":"datasource","type":"datasource","query":"prometheus"}`)
	}

	panels, _ := dash["panels"].([]any)
	for _, p := range panels {
		p, _ := p.(map[string]any)
		if p["type"] == "row" {
			continue
		}
		ds, _ := p["datasource"].(map[string]any)
		if ds["uid"] != "${datasource}" {
			t.Errorf("panel %q: datasource %v, want uid ${datasource}", p["title"], p["datasource"])
		}
		targets, _ := p["targets"].([]any)
		if len(targets) == 0 {
			t.Errorf("panel %q has no targets", p["title"])
		}
		for _, tg := range targets {
			tg, _ := tg.(map[string]any)
			ds, _ := tg["datasource"].(map[string]any)
			if ds != nil && ds["uid"] != "${datasource}" {
				t.Errorf("panel %q target %v: datasource %v, want uid ${datasource}", p["title"], tg["refId"], ds)
			}
		}
	}
}

// TestDashboardPromQLParses hands every dashboard expression to promtool
// as a recording rule, so a syntax error in a panel fails here rather than
// on a screen. Grafana's range variables become a fixed range.
func TestDashboardPromQLParses(t *testing.T) {
	t.Parallel()
	_, exprs := readDashboard(t)
	vars := strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$__range", "6h")
	type rule struct {
		Record string `yaml:"record"`
		Expr   string `yaml:"expr"`
	}
	var rules []rule
	for i, e := range exprs {
		rules = append(rules, rule{Record: fmt.Sprintf("dashboard:panel_%d", i), Expr: vars.Replace(e.expr)})
	}
	doc := map[string]any{"groups": []any{map[string]any{"name": "dashboard", "rules": rules}}}
	b, err := yaml.Marshal(doc)
	if err != nil {
		t.Fatalf("marshal rules: %v", err)
	}
	path := filepath.Join(t.TempDir(), "dashboard_rules.yml")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatalf("write rules: %v", err)
	}
	promtool(t, "check", "rules", path)
}
