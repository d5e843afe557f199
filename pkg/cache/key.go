package cache

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
)

// Key says what a request is, for the cache: who asks, which model tier,
// which layer of the agent pipeline, which tool results it saw, and the
// prompt.
type Key struct {
	// Tenant is the asking tenant. With tenant isolation on (the default)
	// it is part of the scope; it is always stored, for invalidation.
	Tenant string
	// Tier is the route asked for, e.g. "claude/sonnet". Answers of one
	// tier never serve another.
	Tier string
	// Layer is the pipeline layer ("router", "agent", "synthesizer", ...)
	// and selects the TTL. Empty means Config.DefaultLayer.
	Layer string
	// ToolResultsHash identifies the tool results the prompt was built on
	// (empty when none): the same question over new logs is a new scope.
	ToolResultsHash string
	// CaseID ties the stored answer to a diagnosis case, so that new logs
	// for the case can invalidate it (InvalidateCase). Optional; not part
	// of the scope.
	CaseID string
	// Context is what the answer depends on that must match exactly, not
	// by similarity: the system prompt, tool definitions, earlier turns.
	// It is hashed into the scope and never embedded. Optional, but a long
	// shared system prompt inside Prompt swamps the similarity: with 580
	// characters of it, two unrelated questions score 0.98 with the local
	// embedder (1,500 characters: 0.997), above the threshold.
	Context string
	// Prompt is the text compared by similarity and hashed for exact
	// hits: the messages (or, with Context empty, system prompt and
	// messages). The cache applies Normalise itself, so it may be passed
	// raw.
	Prompt string
}

// Normalise returns the canonical form of a prompt for hashing and
// comparison: every run of white space (any Unicode space, including line
// breaks) becomes one space, with none at either end. Case is kept: it can
// carry meaning (identifiers, codes), and the protected-entity patterns see
// the text as written. Normalise is idempotent.
func Normalise(prompt string) string {
	return strings.Join(strings.Fields(prompt), " ")
}

// PromptHash returns the hex SHA-256 of a normalised prompt, the key of an
// exact hit within a scope.
func PromptHash(normalised string) string {
	h := sha256.Sum256([]byte(normalised))
	return hex.EncodeToString(h[:])
}

// Scope returns the partition of the cache a key belongs to: a hash of its
// tier, layer (Config.DefaultLayer when empty), tool-results hash and
// normalised Context, and of its tenant when tenant isolation is on. Lookups only ever match rows
// of the same scope. The result is 32 hex digits (128 bits).
func (c *Cache) Scope(k Key) string {
	return scope(k, c.layer(k), *c.cfg.TenantIsolation)
}

func scope(k Key, layer string, isolate bool) string {
	h := sha256.New()
	// Each part is length-prefixed, so ("a|b", "c") and ("a", "b|c")
	// cannot collide.
	part := func(s string) {
		var n [8]byte
		for i, l := 0, uint64(len(s)); i < 8; i, l = i+1, l>>8 {
			n[i] = byte(l)
		}
		h.Write(n[:])
		h.Write([]byte(s))
	}
	part("bulwark.cache.scope.v1")
	part(k.Tier)
	part(layer)
	part(k.ToolResultsHash)
	part(Normalise(k.Context))
	if isolate {
		part("tenant")
		part(k.Tenant)
	}
	return hex.EncodeToString(h.Sum(nil)[:16])
}

func (c *Cache) layer(k Key) string {
	if k.Layer == "" {
		return c.cfg.DefaultLayer
	}
	return k.Layer
}
