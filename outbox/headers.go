package outbox

import (
	"encoding/binary"
	"errors"
)

// EncodeHeaders packs headers for the outbox's headers column: a uvarint
// count, then per header a uvarint length and the key, a uvarint length and
// the value. No headers encode as nil (a NULL column).
func EncodeHeaders(hs []Header) []byte {
	if len(hs) == 0 {
		return nil
	}
	size := binary.MaxVarintLen64
	for _, h := range hs {
		size += 2*binary.MaxVarintLen64 + len(h.Key) + len(h.Value)
	}
	b := make([]byte, 0, size)
	b = binary.AppendUvarint(b, uint64(len(hs)))
	for _, h := range hs {
		b = binary.AppendUvarint(b, uint64(len(h.Key)))
		b = append(b, h.Key...)
		b = binary.AppendUvarint(b, uint64(len(h.Value)))
		b = append(b, h.Value...)
	}
	return b
}

var errBadHeaders = errors.New("decode headers: truncated or corrupt")

// DecodeHeaders reverses EncodeHeaders.
func DecodeHeaders(b []byte) ([]Header, error) {
	if len(b) == 0 {
		return nil, nil
	}
	n, b, err := uvarint(b)
	if err != nil || n > uint64(len(b)) {
		return nil, errBadHeaders
	}
	hs := make([]Header, 0, n)
	for range n {
		var k, v []byte
		if k, b, err = chunk(b); err != nil {
			return nil, err
		}
		if v, b, err = chunk(b); err != nil {
			return nil, err
		}
		hs = append(hs, Header{Key: string(k), Value: v})
	}
	if len(b) != 0 {
		return nil, errBadHeaders
	}
	return hs, nil
}

func uvarint(b []byte) (uint64, []byte, error) {
	n, k := binary.Uvarint(b)
	if k <= 0 {
		return 0, nil, errBadHeaders
	}
	return n, b[k:], nil
}

func chunk(b []byte) ([]byte, []byte, error) {
	n, b, err := uvarint(b)
	if err != nil || n > uint64(len(b)) {
		return nil, nil, errBadHeaders
	}
	return b[:n:n], b[n:], nil
}
