package alert

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"bulwark/pkg/secret"
)

// Message size caps of the robots. WeCom documents 4096 bytes of UTF-8 for
// markdown content; DingTalk rejects messages beyond about 20000 bytes.
const (
	weComMaxBytes    = 4096
	dingTalkMaxBytes = 20000
	maxResponseBytes = 64 << 10
)

// WeCom sends to a WeCom (企业微信) group robot:
// POST {"msgtype":"markdown","markdown":{"content":"..."}}; the robot
// answers HTTP 200 with {"errcode":0,"errmsg":"ok"} on success and a
// non-zero errcode otherwise (45009: more than 20 messages a minute).
type WeCom struct {
	// URL is https://qyapi.weixin.qq.com/cgi-bin/webhook/send?key=... .
	URL secret.String
	// Language of the text; default zh-CN.
	Language string
	// Client sends the request; nil means http.DefaultClient.
	Client *http.Client
}

// Send implements Sink.
func (w *WeCom) Send(ctx context.Context, e Event) error {
	body := map[string]any{
		"msgtype":  "markdown",
		"markdown": map[string]string{"content": truncateUTF8(Text(e, w.Language), weComMaxBytes)},
	}
	return postJSON(ctx, w.Client, w.URL.Reveal(), body, true, []string{w.URL.Reveal()})
}

// DingTalk sends to a DingTalk (钉钉) custom robot:
// POST {"msgtype":"markdown","markdown":{"title":"...","text":"..."}}. With
// a signing secret, the URL gains timestamp (Unix milliseconds) and sign =
// Base64(HMAC-SHA256(key=secret, timestamp+"\n"+secret)) query parameters;
// DingTalk rejects a timestamp more than an hour off. It answers like WeCom
// ({"errcode":0,"errmsg":"ok"}).
type DingTalk struct {
	// URL is https://oapi.dingtalk.com/robot/send?access_token=... .
	URL secret.String
	// Secret is the optional signing secret ("SEC...").
	Secret secret.String
	// Language of the text; default zh-CN.
	Language string
	// Client sends the request; nil means http.DefaultClient.
	Client *http.Client
}

// Send implements Sink.
func (d *DingTalk) Send(ctx context.Context, e Event) error {
	secrets := []string{d.URL.Reveal(), d.Secret.Reveal()}
	target := d.URL.Reveal()
	if !d.Secret.IsZero() {
		u, err := url.Parse(target)
		if err != nil {
			return errors.New("invalid webhook URL")
		}
		ts := strconv.FormatInt(time.Now().UnixMilli(), 10)
		q := u.Query()
		q.Set("timestamp", ts)
		q.Set("sign", DingTalkSign(ts, d.Secret))
		u.RawQuery = q.Encode()
		target = u.String()
		secrets = append(secrets, target)
	}
	body := map[string]any{
		"msgtype": "markdown",
		"markdown": map[string]string{
			"title": Title(e, d.Language),
			"text":  truncateUTF8(Text(e, d.Language), dingTalkMaxBytes),
		},
	}
	return postJSON(ctx, d.Client, target, body, true, secrets)
}

// DingTalkSign returns DingTalk's robot signature for timestamp (Unix
// milliseconds, decimal): Base64(HMAC-SHA256(secret, timestamp+"\n"+secret)).
// The caller URL-encodes it once as the sign query parameter.
func DingTalkSign(timestamp string, s secret.String) string {
	m := hmac.New(sha256.New, []byte(s.Reveal()))
	m.Write([]byte(timestamp + "\n" + s.Reveal()))
	return base64.StdEncoding.EncodeToString(m.Sum(nil))
}

// Generic POSTs the Event as JSON, with one extra field "text" holding the
// rendered markdown; any 2xx status is success.
type Generic struct {
	// URL of the endpoint. Secret (it may carry a token).
	URL secret.String
	// Language of the "text" field; default zh-CN.
	Language string
	// Client sends the request; nil means http.DefaultClient.
	Client *http.Client
}

// GenericPayload is the body a Generic webhook receives.
type GenericPayload struct {
	Event
	// Text is the event rendered as markdown (see Text).
	Text string `json:"text"`
}

// Send implements Sink.
func (g *Generic) Send(ctx context.Context, e Event) error {
	return postJSON(ctx, g.Client, g.URL.Reveal(), GenericPayload{Event: e, Text: Text(e, g.Language)}, false, []string{g.URL.Reveal()})
}

// robotReply is WeCom's and DingTalk's answer.
type robotReply struct {
	ErrCode *int   `json:"errcode"`
	ErrMsg  string `json:"errmsg"`
}

// postJSON POSTs body to target. robot says the answer is a WeCom/DingTalk
// errcode reply. Every error is scrubbed of the secrets.
func postJSON(ctx context.Context, hc *http.Client, target string, body any, robot bool, secrets []string) error {
	if hc == nil {
		hc = http.DefaultClient
	}
	b, err := json.Marshal(body)
	if err != nil {
		return fmt.Errorf("encode body: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target, bytes.NewReader(b))
	if err != nil {
		return scrub(fmt.Errorf("build request: %w", err), secrets)
	}
	req.Header.Set("Content-Type", "application/json; charset=utf-8")
	resp, err := hc.Do(req)
	if err != nil {
		return scrub(fmt.Errorf("POST: %w", err), secrets)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes))
	if err != nil {
		return scrub(fmt.Errorf("read response: %w", err), secrets)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return scrub(fmt.Errorf("HTTP %d: %s", resp.StatusCode, snippet(data)), secrets)
	}
	if !robot {
		return nil
	}
	var r robotReply
	if err := json.Unmarshal(data, &r); err != nil || r.ErrCode == nil {
		return scrub(fmt.Errorf("unexpected reply: %s", snippet(data)), secrets)
	}
	if *r.ErrCode != 0 {
		return scrub(fmt.Errorf("errcode %d: %s", *r.ErrCode, snippet([]byte(r.ErrMsg))), secrets)
	}
	return nil
}

// scrub makes err safe to log: it drops net/http's *url.Error layer (whose
// text is `Post "<url>": ...`), and if the remaining text still contains a
// secret or a token from a secret URL (a server may echo it back), it
// replaces them with [redacted]. The result still unwraps to the cause, so
// errors.Is(err, context.DeadlineExceeded) keeps working; the chain no
// longer holds the URL.
func scrub(err error, secrets []string) error {
	err = stripURLError(err)
	msg := err.Error()
	clean := msg
	for _, s := range secretParts(secrets) {
		clean = strings.ReplaceAll(clean, s, "[redacted]")
	}
	if clean == msg {
		return err
	}
	return &scrubbedError{msg: clean, err: errors.Unwrap(err)}
}

// stripURLError rebuilds err's message without any *url.Error layer.
func stripURLError(err error) error {
	var ue *url.Error
	if !errors.As(err, &ue) {
		return err
	}
	inner := ue.Err
	// Keep the wrapping operation text ("POST: ") of our own layer.
	if w := errors.Unwrap(err); w == error(ue) {
		prefix, _, _ := strings.Cut(err.Error(), ue.Error())
		return &scrubbedError{msg: prefix + inner.Error(), err: inner}
	}
	return &scrubbedError{msg: inner.Error(), err: inner}
}

// secretParts lists the strings that must not appear in an error: each
// secret, and for URLs their query values, path and escaped forms.
func secretParts(secrets []string) []string {
	var out []string
	add := func(s string) {
		if len(s) >= 6 { // shorter pieces ("send", "robot") are not tokens
			out = append(out, s)
		}
	}
	for _, s := range secrets {
		add(s)
		add(url.QueryEscape(s))
		u, err := url.Parse(s)
		if err != nil || u.Host == "" {
			continue
		}
		add(u.RawQuery)
		for _, vs := range u.Query() {
			for _, v := range vs {
				add(v)
				add(url.QueryEscape(v))
			}
		}
		for _, seg := range strings.Split(u.Path, "/") {
			if len(seg) >= 16 { // tokens in the path (Slack-style hooks)
				add(seg)
			}
		}
	}
	return out
}

type scrubbedError struct {
	msg string
	err error
}

func (e *scrubbedError) Error() string { return e.msg }
func (e *scrubbedError) Unwrap() error { return e.err }

// snippet shortens a response body for an error message.
func snippet(b []byte) string {
	s := strings.TrimSpace(string(b))
	return truncateUTF8(s, 200)
}

// truncateUTF8 cuts s to at most n bytes on a rune boundary, marking the cut.
func truncateUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const mark = "\n…"
	cut := n - len(mark)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + mark
}
