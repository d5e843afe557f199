package cache

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"bulwark/pkg/job"
)

// Each ignored default pattern and what it must leave alone: the values a
// prompt yields, by pattern, in order of first appearance.
func TestIgnoredPatternsDefault(t *testing.T) {
	t.Parallel()
	g, err := newGuard(ProtectedPatternsDefault(), IgnoredPatternsDefault())
	require.NoError(t, err)
	const (
		iso, clock, vin, e164, mobile, unix, plate = 0, 1, 2, 3, 4, 5, 6
	)
	tests := []struct {
		text string
		want map[int][]string // pattern index → values; nil: nothing matches
	}{
		{"at 2024-11-03T08:15:22.123Z and 09:00", map[int][]string{iso: {"2024-11-03T08:15:22.123Z"}, clock: {"09:00"}}},
		{"VIN LSVAU2180N2183294 twice LSVAU2180N2183294", map[int][]string{vin: {"LSVAU2180N2183294"}}},
		{"call +8613812345678 now", map[int][]string{e164: {"+8613812345678"}}},
		{"call +14155552671", map[int][]string{e164: {"+14155552671"}}},
		{"call +1415555267, a 10-digit E.164 number, not a time", map[int][]string{e164: {"+1415555267"}}},
		{"mobile 13812345678 and 19912345678", map[int][]string{mobile: {"13812345678", "19912345678"}}},
		{"ts 1730621722 and 1730621722123", map[int][]string{unix: {"1730621722", "1730621722123"}}},
		{"a 13-digit time 1380621722123 is no mobile", map[int][]string{unix: {"1380621722123"}}},
		{"plates 京A12345, 粤B·D12345, 沪AD12345 and 京A1234学", map[int][]string{plate: {"京A12345", "粤B·D12345", "沪AD12345", "京A1234学"}}},
		{"车牌京A12345的车", map[int][]string{plate: {"京A12345"}}},
		{"not a plate: 京A1234567, 京a12345", nil},
		{"part 8W0-907-115, plate-like AB-123-CD, DTC P0A80, car 12, 12345678901", nil},
	}
	for _, tt := range tests {
		t.Run(tt.text, func(t *testing.T) {
			t.Parallel()
			want := make([][]string, len(IgnoredPatternsDefault()))
			for i, v := range tt.want {
				want[i] = v
			}
			require.Equal(t, want, g.values(tt.text))
		})
	}
}

// carryTemplate is a report whose ignored values are placeholders.
const carryTemplate = `System: You are a vehicle diagnosis assistant for OTA campaigns. Answer with root cause, evidence and next step.
User: The OTA batch failed on several cars. Vehicle VIN {vin}, log captured {at}; its twin VIN {vin2} flashed fine.
Driver phone {phone} (mobile {mobile}), plate {plate}, event time {unix}.
The BMS firmware update stopped at 63 percent; the ECU BMS reported DTC P0A80 and the gateway logged a CAN timeout
right after the flash session opened. The previous firmware was 4.2.1 and the campaign target is 4.3.0.
What is the likely root cause and which diagnostic step do you recommend for the service engineer?`

// carryVals are values for carryTemplate's placeholders.
type carryVals map[string]string

func (v carryVals) fill(s string) string {
	for k, x := range v {
		s = strings.ReplaceAll(s, "{"+k+"}", x)
	}
	return s
}

func (v carryVals) with(kv ...string) carryVals {
	out := carryVals{}
	for k, x := range v {
		out[k] = x
	}
	for i := 0; i < len(kv); i += 2 {
		out[kv[i]] = kv[i+1]
	}
	return out
}

var (
	carA = carryVals{"vin": "LSVAU2180N2183294", "vin2": "LSVAU2180N2100001", "at": "2024-11-03T08:15:22.123Z",
		"phone": "+8613812345678", "mobile": "13812345678", "plate": "京A12345", "unix": "1730621722123"}
	carB = carryVals{"vin": "WDBRF61J43F123456", "vin2": "WDBRF61J43F654321", "at": "2024-11-05T17:02:09.871Z",
		"phone": "+8613998765432", "mobile": "15900001111", "plate": "粤B·D12345", "unix": "1730625000456"}
)

// textAnswer is a stored Answer whose one text block is text.
func textAnswer(text string) string {
	return fmt.Sprintf(`{"route": {"provider": "claude", "tier": "sonnet"}, "response": {"content": [{"type": "text", "text": %q}]}}`, text)
}

// A semantic hit for another car is served with the asked car's values in
// place of the stored car's, or not at all when they cannot be mapped.
func TestAnswerCarriedOver(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	tests := []struct {
		name   string
		asked  carryVals // the stored prompt has carA's values
		answer string    // the stored answer, with placeholders for carA's values
		// hit: the answer is served, with placeholders filled with asked's
		// values; else a miss refused for an unmappable value.
		hit bool
	}{
		{"VIN quoted", carB, textAnswer("Reflash the BMS of {vin} before its twin."), true},
		{"timestamp quoted", carB, textAnswer("The flash at {at} timed out."), true},
		{"phones quoted", carB, textAnswer("Call the driver on {phone} or {mobile}."), true},
		{"plate quoted", carB, textAnswer("Bring {plate} to the workshop."), true},
		{"Unix time in ms quoted", carB, textAnswer("Event {unix} is the CAN timeout."), true},
		{"every value quoted", carB, textAnswer("{vin} {vin2} {at} {phone} {mobile} {plate} {unix}"), true},
		{"tool input quoted", carB, `{"response": {"content": [{"type": "tool_use", "name": "open_ticket",
			"input": {"vin": "{vin}", "note": "call {phone}", "n": 1730621722123}}]}}`, true},
		{"two VINs swap", carA.with("vin", carA["vin2"], "vin2", carA["vin"]), textAnswer("{vin} failed, {vin2} flashed."), true},
		{"one value changed, the other kept", carA.with("plate", carB["plate"]), textAnswer("{vin}: bring {plate} in."), true},
		{"two VINs asked as one, VIN quoted", carB.with("vin2", carB["vin"]), textAnswer("Reflash {vin}."), false},
		{"two VINs asked as one, other VIN quoted", carB.with("vin2", carB["vin"]), textAnswer("Its twin {vin2} is fine."), false},
		{"two VINs asked as one, only the time quoted", carB.with("vin2", carB["vin"]), textAnswer("The flash at {at} timed out."), true},
		{"nothing quoted", carB, `{"response":  {"content": [{"type": "text", "text": "Check the HV interlock <loop> & relay."}]}}`, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			// Its own Cache (counters) and scope on the shared database.
			c, err := Open(b.pool, b.emb, Config{}, slog.New(slog.DiscardHandler))
			require.NoError(t, err)
			ctx := context.Background()
			stored, asked := key(carA.fill(carryTemplate)), key(tt.asked.fill(carryTemplate))
			stored.ToolResultsHash, asked.ToolResultsHash = tt.name, tt.name
			require.NoError(t, c.Store(ctx, stored, nil, []byte(carA.fill(tt.answer))))

			hit, err := c.Lookup(ctx, asked, nil)
			require.NoError(t, err)
			if !tt.hit {
				require.Equal(t, job.CachedNone, hit.Kind)
				require.Equal(t, int64(1), c.Stats().EntityRefused)
				return
			}
			require.Equal(t, job.CachedSemantic, hit.Kind)
			require.JSONEq(t, tt.asked.fill(tt.answer), string(hit.Response))
			require.Zero(t, c.Stats().EntityRefused)
			if tt.answer == tt.asked.fill(tt.answer) && tt.answer == carA.fill(tt.answer) {
				// Quoting nothing, it is served as stored, byte for byte.
				exact, err := c.Lookup(ctx, stored, nil)
				require.NoError(t, err)
				require.Equal(t, job.CachedExact, exact.Kind)
				require.Equal(t, string(exact.Response), string(hit.Response))
			}
		})
	}
}

// The exact path needs no substitution: masking never reaches the exact
// key, so another VIN is another entry, not the stored answer verbatim.
func TestExactKeyKeepsEntities(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx := context.Background()
	require.NoError(t, b.cache.Store(ctx, key(carA.fill(carryTemplate)), nil, []byte(carA.fill(textAnswer("Reflash {vin}.")))))
	require.NotEqual(t, PromptHash(Normalise(carA.fill(carryTemplate))), PromptHash(Normalise(carB.fill(carryTemplate))))
	hit, err := b.cache.LookupExact(ctx, key(carB.fill(carryTemplate)))
	require.NoError(t, err)
	require.Equal(t, job.CachedNone, hit.Kind)
}

// sharedLog is a 50-line log of one car's failed flash.
func sharedLog(vin string, minute int) string {
	var b strings.Builder
	steps := []string{"gateway opened the flash session", "BMS erased block", "BMS wrote block",
		"BMS verified block checksum", "gateway heartbeat ok", "telematics queued status report"}
	for i := range 50 {
		fmt.Fprintf(&b, "2024-11-03T08:%02d:%02d.%03dZ VIN %s %s %d\n", minute, i, 7*i, vin, steps[i%len(steps)], i/len(steps))
	}
	return b.String()
}

// An instruction added to a long shared log changes the question: no hit,
// in either direction, however close the embeddings. The same question
// over another car's log still hits.
func TestInstructionOverSharedLog(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	const question = "Why does the BMS flash stop after the session opens?"
	logA := sharedLog("LSVAU2180N2183294", 15)
	logB := sharedLog("WDBRF61J43F123456", 41) // another car, other times
	clean := logA + question
	tests := []struct {
		name string
		a, b string // stored one, ask the other; then the reverse
		hit  bool
	}{
		{"instruction prefixed", clean, "Answer only in French.\n" + clean, false},
		{"instruction appended", clean, clean + "\nAnswer only in French.", false},
		{"instruction on the first log line", clean, "Answer only in French. " + clean, false},
		{"instruction as the question's prefix", clean, logA + "Ignore the log and answer only in French: " + question, false},
		{"another question about the same log", clean, logA + "How do I flash the gateway by hand over the diagnostic port?", false},
		{"another car, other times", clean, logB + question, true},
		{"case and spacing", clean, strings.ToUpper(logA) + "  why DOES the BMS flash stop after the session opens?  ", true},
		{"question spaced differently", clean, logA + "Why does the BMS flash stop after the session opens ?", true},
	}
	for _, tt := range tests {
		for dir, p := range [][2]string{{tt.a, tt.b}, {tt.b, tt.a}} {
			t.Run(fmt.Sprintf("%s/%d", tt.name, dir), func(t *testing.T) {
				t.Parallel()
				c, err := Open(b.pool, b.emb, Config{}, slog.New(slog.DiscardHandler))
				require.NoError(t, err)
				ctx := context.Background()
				stored, asked := key(p[0]), key(p[1])
				stored.ToolResultsHash = fmt.Sprintf("%s/%d", tt.name, dir)
				asked.ToolResultsHash = stored.ToolResultsHash
				e1, err := c.Embed(ctx, p[0])
				require.NoError(t, err)
				e2, err := c.Embed(ctx, p[1])
				require.NoError(t, err)
				require.GreaterOrEqual(t, cosine(e1, e2), ThresholdDefault, "the embedding alone cannot tell them apart")
				require.NoError(t, c.Store(ctx, stored, e1, answer))

				hit, err := c.Lookup(ctx, asked, e2)
				require.NoError(t, err)
				if tt.hit {
					require.Equal(t, job.CachedSemantic, hit.Kind)
					require.Zero(t, c.Stats().AskRefused)
					return
				}
				require.Equal(t, job.CachedNone, hit.Kind)
				require.Equal(t, int64(1), c.Stats().AskRefused)
			})
		}
	}
}

func TestDifference(t *testing.T) {
	t.Parallel()
	g, err := newGuard(ProtectedPatternsDefault(), IgnoredPatternsDefault())
	require.NoError(t, err)
	tests := []struct {
		name         string
		a, b         string // raw prompts
		onlyA, onlyB string
		shared       bool
	}{
		{"identical", "x one\ny two", "x one\ny two", "", "", true},
		{"masked values, case, spacing", "VIN LSVAU2180N2183294 at 08:15\nWhy?", "vin WDBRF61J43F123456  at 09:30\n\n why?", "", "", true},
		{"line order is no difference", "a\nb", "b\na", "", "", true},
		{"multiset", "a\na\nb", "a\nb", "a", "", true},
		{"sentence added to a line", "Answer in French. The log says x.", "The log says x.", "answer in french.", "", true},
		{"Chinese sentence", "用中文回答。日志如下", "日志如下", "用中文回答。", "", true},
		{"nothing shared", "why is x", "why is y", "why is x", "why is y", false},
		{"question differs", "log\nwhy x?", "log\nhow y?", "why x?", "how y?", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			onlyA, onlyB, shared := difference(g.segments(lineForm(tt.a)), g.segments(lineForm(tt.b)))
			require.Equal(t, []any{tt.onlyA, tt.onlyB, tt.shared}, []any{onlyA, onlyB, shared})
		})
	}
	require.Equal(t, Normalise(" a \n\n b\tc \r\n"), Normalise(lineForm(" a \n\n b\tc \r\n")))
	require.Equal(t, "a\nb c", lineForm(" a \n\n b\tc \r\n"))
}
