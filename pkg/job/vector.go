package job

import (
	"encoding/binary"
	"fmt"
	"math"
)

// encodeVector packs an embedding as little-endian float32s: 4 bytes a
// dimension, decoded without parsing ("" for none).
func encodeVector(v []float32) string {
	if len(v) == 0 {
		return ""
	}
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return string(b)
}

// decodeVector is encodeVector's inverse; "" is no embedding.
func decodeVector(s string) ([]float32, error) {
	if len(s)%4 != 0 {
		return nil, fmt.Errorf("%d bytes is not a whole number of float32s", len(s))
	}
	if s == "" {
		return nil, nil
	}
	b := []byte(s)
	v := make([]float32, len(b)/4)
	for i := range v {
		v[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return v, nil
}
