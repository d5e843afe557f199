package report

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"mime"
	"mime/quotedprintable"
	"net"
	"net/mail"
	"net/smtp"
	"strings"
	"time"

	"bulwark/pkg/alert"
	"bulwark/pkg/secret"
)

// MailTimeoutDefault bounds a SendMail whose context has no deadline.
const MailTimeoutDefault = time.Minute

// MailConfig is an SMTP relay and the report's recipients.
type MailConfig struct {
	// Addr is the relay's host:port, e.g. "smtp.example.com:587".
	Addr string
	// From is the sender address, e.g. "Bulwark <bulwark@example.com>".
	From string
	// To are the recipients; at least one.
	To []string
	// Username enables AUTH PLAIN when set. net/smtp refuses to send it
	// over an unencrypted connection except to localhost, so a remote relay
	// needs StartTLS.
	Username string
	// Password for AUTH PLAIN. Secret.
	Password secret.String
	// StartTLS upgrades the connection with STARTTLS and fails if the relay
	// does not offer it. (Implicit TLS on port 465 is not supported.)
	StartTLS bool
	// TLSConfig for STARTTLS; nil means the system roots and the host of
	// Addr as server name. Set RootCAs for a private CA.
	TLSConfig *tls.Config
}

func (c *MailConfig) validate() (from *mail.Address, to []*mail.Address, err error) {
	var errs []error
	if _, _, err := net.SplitHostPort(c.Addr); err != nil {
		errs = append(errs, fmt.Errorf("report: MailConfig.Addr: want host:port, got %q", c.Addr))
	}
	from, err = mail.ParseAddress(c.From)
	if err != nil {
		errs = append(errs, fmt.Errorf("report: MailConfig.From: %w", err))
	}
	if len(c.To) == 0 {
		errs = append(errs, errors.New("report: MailConfig.To: at least one recipient is required"))
	}
	for i, s := range c.To {
		a, err := mail.ParseAddress(s)
		if err != nil {
			errs = append(errs, fmt.Errorf("report: MailConfig.To[%d]: %w", i, err))
			continue
		}
		to = append(to, a)
	}
	return from, to, errors.Join(errs...)
}

// SendMail sends one plain-text UTF-8 message (quoted-printable) through
// the relay. It uses the standard library's net/smtp: frozen, but complete
// for one relay with STARTTLS and AUTH PLAIN, and it refuses to send a
// password in the clear. ctx bounds the whole exchange (MailTimeoutDefault
// without a deadline); errors never contain the password.
func SendMail(ctx context.Context, cfg MailConfig, subject, body string) error {
	from, to, err := cfg.validate()
	if err != nil {
		return err
	}
	msg, err := buildMessage(from, to, subject, body)
	if err != nil {
		return fmt.Errorf("report: build message: %w", err)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, MailTimeoutDefault)
		defer cancel()
	}
	host, _, _ := net.SplitHostPort(cfg.Addr)

	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", cfg.Addr)
	if err != nil {
		return fmt.Errorf("report: smtp dial: %w", err)
	}
	// net/smtp takes no context: end blocked I/O when ctx ends (its
	// deadline included; ctx.Err is set by then, so errors name it).
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()

	c, err := smtp.NewClient(conn, host)
	if err != nil {
		_ = conn.Close()
		return fmt.Errorf("report: smtp greeting: %w", ctxErr(ctx, err))
	}
	defer func() { _ = c.Close() }()
	if err := c.Hello("localhost"); err != nil {
		return fmt.Errorf("report: smtp EHLO: %w", ctxErr(ctx, err))
	}
	if cfg.StartTLS {
		if ok, _ := c.Extension("STARTTLS"); !ok {
			return errors.New("report: smtp: StartTLS is set but the relay does not offer STARTTLS")
		}
		tc := cfg.TLSConfig.Clone()
		if tc == nil {
			tc = &tls.Config{}
		}
		if tc.ServerName == "" {
			tc.ServerName = host
		}
		if tc.MinVersion == 0 {
			tc.MinVersion = tls.VersionTLS12
		}
		if err := c.StartTLS(tc); err != nil {
			return fmt.Errorf("report: smtp STARTTLS: %w", ctxErr(ctx, err))
		}
	}
	if cfg.Username != "" {
		if ok, _ := c.Extension("AUTH"); !ok {
			return errors.New("report: smtp: Username is set but the relay offers no AUTH")
		}
		if err := c.Auth(smtp.PlainAuth("", cfg.Username, cfg.Password.Reveal(), host)); err != nil {
			return fmt.Errorf("report: smtp AUTH: %w", ctxErr(ctx, err))
		}
	}
	if err := c.Mail(from.Address); err != nil {
		return fmt.Errorf("report: smtp MAIL FROM: %w", ctxErr(ctx, err))
	}
	for _, a := range to {
		if err := c.Rcpt(a.Address); err != nil {
			return fmt.Errorf("report: smtp RCPT TO: %w", ctxErr(ctx, err))
		}
	}
	wc, err := c.Data()
	if err != nil {
		return fmt.Errorf("report: smtp DATA: %w", ctxErr(ctx, err))
	}
	if _, err := wc.Write(msg); err != nil {
		_ = wc.Close()
		return fmt.Errorf("report: smtp DATA: %w", ctxErr(ctx, err))
	}
	if err := wc.Close(); err != nil {
		return fmt.Errorf("report: smtp DATA: %w", ctxErr(ctx, err))
	}
	// The relay accepted the message when DATA closed; a failed QUIT must
	// not make the caller send it twice.
	_ = c.Quit() // the message is accepted; a failed QUIT loses nothing
	return nil
}

// ctxErr prefers the context's error to the I/O timeout it caused.
func ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%w (%w)", ctx.Err(), err)
	}
	return err
}

// buildMessage renders an RFC 5322 message with CRLF line ends.
func buildMessage(from *mail.Address, to []*mail.Address, subject, body string) ([]byte, error) {
	// A CR or LF in the subject would start a new header.
	subject = strings.NewReplacer("\r", " ", "\n", " ").Replace(subject)
	rcpts := make([]string, len(to))
	for i, a := range to {
		rcpts[i] = a.String()
	}
	domain := "localhost"
	if _, d, ok := strings.Cut(from.Address, "@"); ok {
		domain = d
	}
	id := make([]byte, 12)
	rand.Read(id)

	var b bytes.Buffer
	header := func(k, v string) { b.WriteString(k + ": " + v + "\r\n") }
	header("From", from.String())
	header("To", strings.Join(rcpts, ", "))
	header("Subject", mime.QEncoding.Encode("utf-8", subject))
	header("Date", time.Now().Format(time.RFC1123Z))
	header("Message-ID", "<"+hex.EncodeToString(id)+"@"+domain+">")
	header("MIME-Version", "1.0")
	header("Content-Type", "text/plain; charset=utf-8")
	header("Content-Transfer-Encoding", "quoted-printable")
	b.WriteString("\r\n")
	// A message ends with a line break (the DATA terminator would add one).
	if !strings.HasSuffix(body, "\n") {
		body += "\n"
	}
	qp := quotedprintable.NewWriter(&b)
	if _, err := qp.Write([]byte(body)); err != nil {
		return nil, err
	}
	if err := qp.Close(); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// Notifier is what Deliver needs of *alert.Notifier.
type Notifier interface {
	Notify(ctx context.Context, e alert.Event) error
}

// Deliver sends r rendered in lang to the webhooks, as one
// alert.KindDailyReport event (never throttled), when n is not nil, and by
// e-mail when mail is not nil. Both are tried; the errors are joined.
//
// Long reports are cut by the robots' size caps (WeCom: 4096 bytes); the
// e-mail always carries the whole text.
func Deliver(ctx context.Context, r *Report, n Notifier, mail *MailConfig, lang string) error {
	md := r.Markdown(lang)
	var errs []error
	if n != nil {
		e := alert.Event{
			Kind:     alert.KindDailyReport,
			Severity: alert.SeverityInfo,
			Subject:  r.From.Format(time.DateOnly),
			Summary:  md,
			At:       r.GeneratedAt,
		}
		if err := n.Notify(ctx, e); err != nil {
			errs = append(errs, fmt.Errorf("report: deliver to webhooks: %w", err))
		}
	}
	if mail != nil {
		if err := SendMail(ctx, *mail, r.Title(lang), md); err != nil {
			errs = append(errs, fmt.Errorf("report: deliver by e-mail: %w", err))
		}
	}
	return errors.Join(errs...)
}
