package report

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"io"
	"math/big"
	"mime"
	"mime/quotedprintable"
	"net"
	"net/http"
	"net/http/httptest"
	"net/mail"
	"strings"
	"testing"
	"time"

	"github.com/emersion/go-sasl"
	"github.com/emersion/go-smtp"

	"bulwark/pkg/alert"
	"bulwark/pkg/secret"
	"bulwark/pkg/testkit/testenv"
)

// received is one message the sink accepted.
type received struct {
	from     string
	to       []string
	user     string
	password string
	tls      bool
	data     []byte
}

// sink is a local SMTP server (emersion/go-smtp) that records messages.
type sink struct {
	addr string
	got  chan received
}

type sinkOpts struct {
	tls      *tls.Config // offer STARTTLS with this
	user     string      // require AUTH PLAIN with user/password
	password string
}

func newSink(t *testing.T, o sinkOpts) *sink {
	t.Helper()
	s := &sink{got: make(chan received, 10)}
	srv := smtp.NewServer(smtp.BackendFunc(func(c *smtp.Conn) (smtp.Session, error) {
		return &session{sink: s, opts: o, conn: c}, nil
	}))
	srv.Domain = "localhost"
	srv.TLSConfig = o.tls
	srv.AllowInsecureAuth = o.tls == nil
	srv.ReadTimeout = 10 * time.Second
	srv.WriteTimeout = 10 * time.Second
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.addr = l.Addr().String()
	done := make(chan struct{})
	go func() { defer close(done); srv.Serve(l) }()
	t.Cleanup(func() { srv.Close(); <-done })
	return s
}

func (s *sink) next(t *testing.T) received {
	t.Helper()
	select {
	case r := <-s.got:
		return r
	case <-time.After(5 * time.Second):
		t.Fatal("SMTP sink got no message")
		return received{}
	}
}

type session struct {
	sink *sink
	opts sinkOpts
	conn *smtp.Conn
	cur  received
}

func (s *session) AuthMechanisms() []string { return []string{sasl.Plain} }

func (s *session) Auth(string) (sasl.Server, error) {
	return sasl.NewPlainServer(func(_, user, pass string) error {
		if user != s.opts.user || pass != s.opts.password {
			return smtp.ErrAuthFailed
		}
		s.cur.user, s.cur.password = user, pass
		return nil
	}), nil
}

func (s *session) Mail(from string, _ *smtp.MailOptions) error {
	if s.opts.user != "" && s.cur.user == "" {
		return smtp.ErrAuthRequired
	}
	s.cur.from = from
	return nil
}

func (s *session) Rcpt(to string, _ *smtp.RcptOptions) error {
	s.cur.to = append(s.cur.to, to)
	return nil
}

func (s *session) Data(r io.Reader) error {
	b, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	s.cur.data = b
	_, s.cur.tls = s.conn.TLSConnectionState()
	s.sink.got <- s.cur
	return nil
}

func (s *session) Reset()        { s.cur = received{user: s.cur.user, password: s.cur.password} }
func (s *session) Logout() error { return nil }

// parse decodes a received message into subject and body (without the
// final line break every message ends with).
func parse(t *testing.T, data []byte) (subject, body string, h mail.Header) {
	t.Helper()
	m, err := mail.ReadMessage(strings.NewReader(string(data)))
	if err != nil {
		t.Fatalf("message does not parse: %v\n%s", err, data)
	}
	subject, err = new(mime.WordDecoder).DecodeHeader(m.Header.Get("Subject"))
	if err != nil {
		t.Fatalf("subject: %v", err)
	}
	b, err := io.ReadAll(quotedprintable.NewReader(m.Body))
	if err != nil {
		t.Fatalf("body: %v", err)
	}
	return subject, strings.TrimSuffix(strings.ReplaceAll(string(b), "\r\n", "\n"), "\n"), m.Header
}

// selfSigned returns a server TLS config for 127.0.0.1 and a client config
// trusting it.
func selfSigned(t *testing.T) (server, client *tls.Config) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IPAddresses:           []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}},
		&tls.Config{RootCAs: pool}
}

const mailBody = "# Bulwark 日报\n\n- 请求总数：10\n- 缓存命中率：20.0%\n.\n" + // a lone dot must survive
	"a long line that quoted-printable has to wrap because it is longer than seventy-six characters in total"

func TestSendMail(t *testing.T) {
	t.Parallel()
	s := newSink(t, sinkOpts{})
	cfg := MailConfig{Addr: s.addr, From: "Bulwark <bulwark@example.com>", To: []string{"ops@example.com", "Lead <lead@example.com>"}}
	subject := "Bulwark 日报 2026-03-01"
	if err := SendMail(context.Background(), cfg, subject, mailBody); err != nil {
		t.Fatalf("SendMail: %v", err)
	}
	r := s.next(t)
	if r.from != "bulwark@example.com" || strings.Join(r.to, ",") != "ops@example.com,lead@example.com" {
		t.Errorf("envelope from %q to %v", r.from, r.to)
	}
	gotSubject, gotBody, h := parse(t, r.data)
	if gotSubject != subject {
		t.Errorf("subject = %q, want %q", gotSubject, subject)
	}
	if gotBody != mailBody {
		t.Errorf("body = %q, want %q", gotBody, mailBody)
	}
	if h.Get("Content-Type") != "text/plain; charset=utf-8" || h.Get("Message-Id") == "" || h.Get("Date") == "" {
		t.Errorf("headers: %v", h)
	}
	if r.tls {
		t.Error("plain relay reported TLS")
	}
}

func TestSendMailStartTLSAndAuth(t *testing.T) {
	t.Parallel()
	serverTLS, clientTLS := selfSigned(t)
	const password = "pw-7c1d2e9f0a"
	s := newSink(t, sinkOpts{tls: serverTLS, user: "bulwark", password: password})
	cfg := MailConfig{
		Addr: s.addr, From: "bulwark@example.com", To: []string{"ops@example.com"},
		Username: "bulwark", Password: secret.New(password), StartTLS: true, TLSConfig: clientTLS,
	}
	if err := SendMail(context.Background(), cfg, "s", "b"); err != nil {
		t.Fatalf("SendMail: %v", err)
	}
	r := s.next(t)
	if !r.tls || r.user != "bulwark" || r.password != password {
		t.Errorf("tls %v, auth %q/%q", r.tls, r.user, r.password)
	}

	// A wrong password fails, and the error does not carry the password.
	bad := cfg
	bad.Password = secret.New("wrong-" + password)
	err := SendMail(context.Background(), bad, "s", "b")
	if err == nil || !strings.Contains(err.Error(), "AUTH") {
		t.Fatalf("SendMail with a wrong password = %v, want an AUTH error", err)
	}
	if strings.Contains(err.Error(), password) {
		t.Errorf("error leaks the password: %v", err)
	}
}

func TestSendMailStartTLSNotOffered(t *testing.T) {
	t.Parallel()
	s := newSink(t, sinkOpts{})
	err := SendMail(context.Background(), MailConfig{Addr: s.addr, From: "a@b.c", To: []string{"d@e.f"}, StartTLS: true}, "s", "b")
	if err == nil || !strings.Contains(err.Error(), "does not offer STARTTLS") {
		t.Fatalf("SendMail = %v, want a STARTTLS error", err)
	}
	select {
	case r := <-s.got:
		t.Fatalf("message sent in the clear: %s", r.data)
	default:
	}
}

func TestSendMailContext(t *testing.T) {
	t.Parallel()
	// A relay that accepts and never greets.
	addr := testenv.SilentServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := SendMail(ctx, MailConfig{Addr: addr, From: "a@b.c", To: []string{"d@e.f"}}, "s", "b")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("SendMail = %v, want context.DeadlineExceeded", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("SendMail took %s after a 100ms deadline", d)
	}
}

func TestMailConfigValidate(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		cfg  MailConfig
		want string
	}{
		{"no port", MailConfig{Addr: "smtp.example.com", From: "a@b.c", To: []string{"d@e.f"}}, "MailConfig.Addr"},
		{"bad from", MailConfig{Addr: "h:25", From: "nobody", To: []string{"d@e.f"}}, "MailConfig.From"},
		{"no recipients", MailConfig{Addr: "h:25", From: "a@b.c"}, "MailConfig.To"},
		{"bad recipient", MailConfig{Addr: "h:25", From: "a@b.c", To: []string{"d@e.f", "x"}}, "MailConfig.To[1]"},
	}
	for _, c := range cases {
		err := SendMail(context.Background(), c.cfg, "s", "b")
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: SendMail = %v, want an error naming %s", c.name, err, c.want)
		}
	}
}

func TestBuildMessageHeaderInjection(t *testing.T) {
	t.Parallel()
	from, _ := mail.ParseAddress("a@b.c")
	to, _ := mail.ParseAddress("d@e.f")
	msg, err := buildMessage(from, []*mail.Address{to}, "hi\r\nBcc: evil@x.y", "b")
	if err != nil {
		t.Fatal(err)
	}
	m, err := mail.ReadMessage(strings.NewReader(string(msg)))
	if err != nil {
		t.Fatal(err)
	}
	if m.Header.Get("Bcc") != "" {
		t.Fatalf("subject injected a header: %s", msg)
	}
}

func TestDeliver(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	insert(t, pool, fixture())
	r, err := Build(context.Background(), pool, from, to)
	if err != nil {
		t.Fatal(err)
	}

	events := make(chan alert.GenericPayload, 2)
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		var p alert.GenericPayload
		if err := json.NewDecoder(req.Body).Decode(&p); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		events <- p
	}))
	t.Cleanup(hook.Close)
	n, err := alert.New(nil, alert.Config{Generic: []alert.Webhook{{URL: secret.New(hook.URL)}}, Throttle: -1}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	s := newSink(t, sinkOpts{})
	mc := &MailConfig{Addr: s.addr, From: "bulwark@example.com", To: []string{"ops@example.com"}}

	if err := Deliver(context.Background(), r, n, mc, "en"); err != nil {
		t.Fatalf("Deliver: %v", err)
	}
	e := <-events // Notify returned: the webhook was served
	if e.Kind != alert.KindDailyReport || e.Subject != "2026-03-01" || e.Text != r.Markdown("en") {
		t.Errorf("webhook event = %+v", e.Event)
	}
	subject, body, _ := parse(t, s.next(t).data)
	if subject != "Bulwark daily report 2026-03-01" || body != r.Markdown("en") {
		t.Errorf("mail subject %q body:\n%s", subject, body)
	}

	// A mail failure does not stop the webhook, and is reported.
	bad := &MailConfig{Addr: "127.0.0.1:1", From: "a@b.c", To: []string{"d@e.f"}}
	err = Deliver(context.Background(), r, n, bad, "zh")
	if err == nil || !strings.Contains(err.Error(), "deliver by e-mail") {
		t.Fatalf("Deliver = %v, want an e-mail error", err)
	}
	if e := <-events; !strings.Contains(e.Text, "Bulwark 日报") {
		t.Errorf("webhook text = %q", e.Text)
	}

	if err := Deliver(context.Background(), r, nil, nil, "zh"); err != nil {
		t.Errorf("Deliver to nowhere = %v", err)
	}
}
