// Package secret holds credentials (provider keys, client tokens) in a type
// that cannot be printed, logged, marshalled or wrapped into an error by
// accident: every formatting path yields "[redacted]". The value is read only
// through Reveal, at the one place that puts it on the wire.
package secret

import (
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
)

const redacted = "[redacted]"

// String is a secret string. The zero value is the empty secret.
type String struct {
	v string // never exported, never formatted
}

// New wraps s.
func New(s string) String { return String{v: s} }

// Reveal returns the secret itself. Call it only where the value goes on the
// wire to the party it belongs to.
func (s String) Reveal() string { return s.v }

// IsZero reports whether the secret is empty.
func (s String) IsZero() bool { return s.v == "" }

// Equal compares two secrets in constant time with respect to their contents.
func (s String) Equal(o String) bool {
	a, b := sha256.Sum256([]byte(s.v)), sha256.Sum256([]byte(o.v))
	var d byte
	for i := range a {
		d |= a[i] ^ b[i]
	}
	return d == 0
}

// SHA256 returns the hex SHA-256 of the secret, the form in which client
// tokens are stored and compared.
func (s String) SHA256() string {
	h := sha256.Sum256([]byte(s.v))
	return hex.EncodeToString(h[:])
}

// String implements fmt.Stringer.
func (String) String() string { return redacted }

// GoString implements fmt.GoStringer, so %#v redacts too.
func (String) GoString() string { return redacted }

// MarshalJSON implements json.Marshaler.
func (String) MarshalJSON() ([]byte, error) { return []byte(`"` + redacted + `"`), nil }

// MarshalText implements encoding.TextMarshaler (YAML, map keys).
func (String) MarshalText() ([]byte, error) { return []byte(redacted), nil }

// LogValue implements slog.LogValuer.
func (String) LogValue() slog.Value { return slog.StringValue(redacted) }

// UnmarshalText implements encoding.TextUnmarshaler, so configuration files
// decode straight into a secret.
func (s *String) UnmarshalText(b []byte) error {
	s.v = string(b)
	return nil
}
