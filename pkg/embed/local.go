package embed

import (
	"context"
	"fmt"
	"math"
	"strings"
	"unicode"
)

// DimsDefault is the local embedder's default vector length.
const DimsDefault = 384

// DimsMax is the largest vector length accepted: pgvector's limit for the
// vector type. Note that an HNSW index on vector accepts at most 2,000.
const DimsMax = 16000

// Local is the built-in embedder: feature hashing of the normalised text.
//
// Features are the word unigrams (maximal runs of letters and digits) and
// the character 3- and 4-grams of the normalised text (lower case, runs of
// white space collapsed to one space, padded with a space at each end),
// counted over runes so Chinese text works too. Each feature is hashed
// (FNV-1a 64 with a splitmix64 finaliser, fixed seeds, so every process on
// every machine agrees) into one of Dims buckets with a hash-derived sign,
// and the vector is L2-normalised, so cosine similarity is a dot product.
//
// Limits: it is lexical, not semantic. Two prompts that differ in a few
// tokens (a VIN, a timestamp, a request id) score very close to 1, and more
// so the longer the shared text; two paraphrases that use different words
// score low, and will not hit the cache at a 0.95 threshold. Short texts
// that differ in one token score lower than long ones, which is why the
// cache's protected-entity guard, not the threshold, must tell diagnostic
// codes apart. The empty text embeds to the zero vector, which matches
// nothing. Changing the features changes every vector: such a change must
// change Name too.
type Local struct {
	dims int
}

// NewLocal returns the local embedder with dims dimensions; 0 means
// DimsDefault (384).
func NewLocal(dims int) (*Local, error) {
	if dims == 0 {
		dims = DimsDefault
	}
	if dims < 1 || dims > DimsMax {
		return nil, fmt.Errorf("embed: local dims %d: want 1..%d", dims, DimsMax)
	}
	return &Local{dims: dims}, nil
}

// Name returns "local-ngram-<dims>".
func (l *Local) Name() string { return fmt.Sprintf("local-ngram-%d", l.dims) }

// Dims returns the vector length.
func (l *Local) Dims() int { return l.dims }

// Embed embeds each text. It never fails except on a cancelled context.
func (l *Local) Embed(ctx context.Context, texts []string) ([][]float32, error) {
	out := make([][]float32, len(texts))
	for i, t := range texts {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("embed: local: %w", err)
		}
		out[i] = l.embedOne(t)
	}
	return out, nil
}

// normalise is the text normalisation the local embedder applies before
// extracting features: lower case, and every run of white space replaced by
// one space, with none at either end.
func normalise(s string) string {
	return strings.Join(strings.Fields(strings.ToLower(s)), " ")
}

// Feature kinds, mixed into the hash so that the word "abc" and the
// trigram "abc" land in unrelated buckets.
const (
	featWord  = 'w'
	featGram3 = '3'
	featGram4 = '4'
)

func (l *Local) embedOne(text string) []float32 {
	v := make([]float64, l.dims)
	norm := normalise(text)
	if norm == "" {
		return make([]float32, l.dims)
	}
	runes := []rune(" " + norm + " ")

	// Word unigrams.
	start := -1
	for i, r := range runes {
		word := unicode.IsLetter(r) || unicode.IsDigit(r)
		switch {
		case word && start < 0:
			start = i
		case !word && start >= 0:
			l.add(v, featWord, runes[start:i])
			start = -1
		}
	}
	// Character n-grams (the padding makes word edges features too).
	for i := 0; i+3 <= len(runes); i++ {
		l.add(v, featGram3, runes[i:i+3])
		if i+4 <= len(runes) {
			l.add(v, featGram4, runes[i:i+4])
		}
	}

	var sum float64
	for _, x := range v {
		sum += x * x
	}
	out := make([]float32, l.dims)
	if sum == 0 {
		return out
	}
	inv := 1 / math.Sqrt(sum)
	for i, x := range v {
		out[i] = float32(x * inv)
	}
	return out
}

// add hashes one feature into v with its signed weight of 1.
func (l *Local) add(v []float64, kind byte, feat []rune) {
	h := hashFeature(kind, feat)
	idx := (h >> 1) % uint64(l.dims)
	if h&1 == 1 {
		v[idx]--
	} else {
		v[idx]++
	}
}

// hashFeature is FNV-1a 64 over the kind byte and the runes (4 bytes each,
// little endian), then the splitmix64 finaliser so every bit depends on
// every input bit (FNV's low bits alone mix poorly).
func hashFeature(kind byte, feat []rune) uint64 {
	const (
		offset = 14695981039346656037
		prime  = 1099511628211
	)
	h := uint64(offset)
	h ^= uint64(kind)
	h *= prime
	for _, r := range feat {
		u := uint32(r)
		for range 4 {
			h ^= uint64(u & 0xff)
			h *= prime
			u >>= 8
		}
	}
	h ^= h >> 30
	h *= 0xbf58476d1ce4e5b9
	h ^= h >> 27
	h *= 0x94d049bb133111eb
	h ^= h >> 31
	return h
}
