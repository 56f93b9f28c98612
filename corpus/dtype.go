package corpus

import (
	"encoding/binary"
	"fmt"
	"strings"
)

// Dtype is the integer type of a corpus's tokens, as they lie in its
// files (little-endian).
type Dtype uint8

// The token dtypes. The zero value is no dtype: a flat token file must be
// given one.
const (
	NoDtype Dtype = iota
	Uint8
	Int8
	Int16
	Uint16
	Int32
	Uint32
	Int64
	Uint64
)

var dtypeNames = [...]string{"", "uint8", "int8", "int16", "uint16", "int32", "uint32", "int64", "uint64"}

func (d Dtype) String() string {
	if int(d) < len(dtypeNames) && d != NoDtype {
		return dtypeNames[d]
	}
	return fmt.Sprintf("dtype(%d)", uint8(d))
}

// Numpy is the numpy dtype string of the tokens as they lie ("<u2").
func (d Dtype) Numpy() string {
	switch d {
	case Uint8:
		return "|u1"
	case Int8:
		return "|i1"
	case NoDtype:
		return ""
	}
	return "<" + map[Dtype]string{Int16: "i2", Uint16: "u2", Int32: "i4", Uint32: "u4", Int64: "i8", Uint64: "u8"}[d]
}

// Size is the bytes of one token.
func (d Dtype) Size() int {
	switch d {
	case Uint8, Int8:
		return 1
	case Int16, Uint16:
		return 2
	case Int32, Uint32:
		return 4
	case Int64, Uint64:
		return 8
	}
	return 0
}

// ParseDtype reads a dtype's name ("uint16") or a numpy dtype string of a
// little-endian integer ("<u2", "|u1", "int32").
func ParseDtype(s string) (Dtype, error) {
	for i, n := range dtypeNames {
		if n != "" && n == s {
			return Dtype(i), nil
		}
	}
	np := map[string]Dtype{"u1": Uint8, "i1": Int8, "i2": Int16, "u2": Uint16, "i4": Int32, "u4": Uint32, "i8": Int64, "u8": Uint64}
	t := s
	if strings.HasPrefix(t, "<") || (strings.HasPrefix(t, "|") || strings.HasPrefix(t, "=")) && len(t) == 3 && t[2] == '1' {
		t = t[1:]
	} else if strings.HasPrefix(t, "=") {
		t = t[1:] // numpy's native order: little-endian on every machine riffle runs on
	}
	if d, ok := np[t]; ok {
		return d, nil
	}
	if strings.HasPrefix(s, ">") {
		return NoDtype, fmt.Errorf("dtype %q is big-endian: riffle reads little-endian tokens (numpy: arr.astype(arr.dtype.newbyteorder('<')))", s)
	}
	return NoDtype, fmt.Errorf("dtype %q is not an integer token type (uint8, int8, int16, uint16, int32, uint32, int64, uint64)", s)
}

// decode turns n little-endian tokens of src into dst.
func (d Dtype) decode(dst []int64, src []byte) {
	switch d {
	case Uint8:
		for i := range dst {
			dst[i] = int64(src[i])
		}
	case Int8:
		for i := range dst {
			dst[i] = int64(int8(src[i]))
		}
	case Int16:
		for i := range dst {
			dst[i] = int64(int16(binary.LittleEndian.Uint16(src[2*i:])))
		}
	case Uint16:
		for i := range dst {
			dst[i] = int64(binary.LittleEndian.Uint16(src[2*i:]))
		}
	case Int32:
		for i := range dst {
			dst[i] = int64(int32(binary.LittleEndian.Uint32(src[4*i:])))
		}
	case Uint32:
		for i := range dst {
			dst[i] = int64(binary.LittleEndian.Uint32(src[4*i:]))
		}
	case Int64:
		for i := range dst {
			dst[i] = int64(binary.LittleEndian.Uint64(src[8*i:]))
		}
	case Uint64:
		for i := range dst {
			dst[i] = int64(binary.LittleEndian.Uint64(src[8*i:]))
		}
	}
}

// put writes tokens of src into dst, little-endian.
func (d Dtype) put(dst []byte, src []int64) {
	switch d.Size() {
	case 1:
		for i, v := range src {
			dst[i] = byte(v)
		}
	case 2:
		for i, v := range src {
			binary.LittleEndian.PutUint16(dst[2*i:], uint16(v))
		}
	case 4:
		for i, v := range src {
			binary.LittleEndian.PutUint32(dst[4*i:], uint32(v))
		}
	case 8:
		for i, v := range src {
			binary.LittleEndian.PutUint64(dst[8*i:], uint64(v))
		}
	}
}
