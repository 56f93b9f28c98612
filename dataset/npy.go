package dataset

import (
	"context"
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/riffle-ml/riffle/storage"
)

// A .npy array's record is one row along axis 0: the header gives the dtype
// and shape, and the rows follow it back to back, so it is a fixed-size file
// whose header length is read from the file.

const npyMagic = "\x93NUMPY"

// NpyHeader is the parsed header of a .npy file.
type NpyHeader struct {
	Descr        string // numpy dtype string, "<f4"
	ItemSize     int
	FortranOrder bool
	Shape        []int
	DataOffset   int64 // where the array's bytes start
}

func init() {
	RegisterFormat(Format{Name: "npy", Extensions: []string{".npy"}, OpenPart: openNpy})
}

func openNpy(ctx context.Context, f storage.Reader, opts Options) (Part, error) {
	n := int64(4096)
	if f.Size() < n {
		n = f.Size()
	}
	buf := make([]byte, n)
	if err := f.ReadAt(ctx, buf, 0); err != nil {
		return nil, err
	}
	h, err := ParseNpyHeader(buf)
	if err == nil && h.DataOffset > int64(len(buf)) {
		// A header longer than our first read (many fields, long shapes).
		buf = make([]byte, h.DataOffset)
		if err = f.ReadAt(ctx, buf, 0); err == nil {
			h, err = ParseNpyHeader(buf)
		}
	}
	if err != nil {
		return nil, &FormatError{Path: f.Name(), Offset: 0, Err: err}
	}
	if h.FortranOrder && len(h.Shape) > 1 {
		return nil, &FormatError{Path: f.Name(), Offset: 0, Err: fmt.Errorf("fortran_order arrays have no contiguous rows: %w", ErrUnsupported)}
	}
	rows := 1
	if len(h.Shape) > 0 {
		rows = h.Shape[0]
	}
	size := h.ItemSize
	var inner []int
	if len(h.Shape) > 0 {
		inner = append([]int{}, h.Shape[1:]...)
	}
	for _, d := range inner {
		size *= d
	}
	inf := Info{RecordSize: size, Dtype: h.Descr, Shape: inner}
	if size == 0 {
		return nil, &FormatError{Path: f.Name(), Offset: h.DataOffset, Err: fmt.Errorf("rows of shape %v hold no bytes: %w", inner, ErrEmpty)}
	}
	want := h.DataOffset + int64(rows)*int64(size)
	if f.Size() < want {
		return nil, &FormatError{Path: f.Name(), Offset: f.Size(),
			Err: fmt.Errorf("shape %v needs %d bytes, file has %d: %w", h.Shape, want, f.Size(), ErrPartial)}
	}
	return &fixedPart{header: h.DataOffset, size: size, n: rows, inf: inf}, nil
}

// ParseNpyHeader parses the magic, version and header dictionary at the
// start of a .npy file.
func ParseNpyHeader(b []byte) (NpyHeader, error) {
	var h NpyHeader
	if len(b) < 10 || string(b[:6]) != npyMagic {
		return h, fmt.Errorf("not a .npy file (no \\x93NUMPY magic): %w", ErrCorrupt)
	}
	major := b[6]
	var hlen, start int
	switch major {
	case 1:
		hlen, start = int(binary.LittleEndian.Uint16(b[8:10])), 10
	case 2, 3:
		if len(b) < 12 {
			return h, fmt.Errorf("truncated .npy header: %w", ErrCorrupt)
		}
		v := binary.LittleEndian.Uint32(b[8:12])
		if v > 1<<24 {
			return h, fmt.Errorf(".npy header length %d is implausible: %w", v, ErrCorrupt)
		}
		hlen, start = int(v), 12
	default:
		return h, fmt.Errorf(".npy version %d.%d: %w", major, b[7], ErrUnsupported)
	}
	h.DataOffset = int64(start + hlen)
	if len(b) < start+hlen {
		return h, nil // the caller reads more and calls again
	}
	raw := b[start : start+hlen]
	var dict string
	if major < 3 {
		// Versions 1 and 2 write the header in Latin-1 (a field name 'ñ'
		// is one byte); version 3 in UTF-8.
		r := make([]rune, len(raw))
		for i, c := range raw {
			r[i] = rune(c)
		}
		dict = strings.TrimSpace(string(r))
	} else {
		if !utf8.Valid(raw) {
			return h, fmt.Errorf(".npy version 3 header is not UTF-8: %w", ErrCorrupt)
		}
		dict = strings.TrimSpace(string(raw))
	}
	fields, err := parsePyDict(dict)
	if err != nil {
		return h, err
	}
	descr, ok := fields["descr"]
	if !ok {
		return h, fmt.Errorf(".npy header has no 'descr': %w", ErrCorrupt)
	}
	dv, err := parsePyLiteral(descr)
	if err != nil {
		return h, fmt.Errorf(".npy header descr: %w", err)
	}
	if dv.str != nil {
		h.Descr = *dv.str
	} else {
		// A structured dtype: its list of fields, as numpy writes it
		// (numpy.dtype(ast.literal_eval(descr)) makes it again).
		h.Descr = descr
	}
	if h.ItemSize, err = descrSize(dv, 0); err != nil {
		return h, err
	}
	switch fields["fortran_order"] {
	case "True":
		h.FortranOrder = true
	case "False":
	default:
		return h, fmt.Errorf(".npy header fortran_order %q: %w", fields["fortran_order"], ErrCorrupt)
	}
	shape, ok := fields["shape"]
	if !ok || len(shape) < 2 || shape[0] != '(' || shape[len(shape)-1] != ')' {
		return h, fmt.Errorf(".npy header shape %q: %w", shape, ErrCorrupt)
	}
	for _, s := range strings.Split(shape[1:len(shape)-1], ",") {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		d, err := strconv.Atoi(strings.TrimSuffix(s, "L"))
		if err != nil || d < 0 || d > 1<<40 {
			return h, fmt.Errorf(".npy header shape %q: %w", shape, ErrCorrupt)
		}
		h.Shape = append(h.Shape, d)
	}
	return h, nil
}

// parsePyDict splits the flat Python dict literal numpy writes into its
// keys and raw values. Values may be strings, names or tuples.
func parsePyDict(s string) (map[string]string, error) {
	if len(s) < 2 || s[0] != '{' || s[len(s)-1] != '}' {
		return nil, fmt.Errorf(".npy header is not a dict: %w", ErrCorrupt)
	}
	s = s[1 : len(s)-1]
	out := map[string]string{}
	for {
		s = strings.TrimLeft(s, " ,")
		if s == "" {
			return out, nil
		}
		if s[0] != '\'' && s[0] != '"' {
			return nil, fmt.Errorf(".npy header key at %q: %w", trunc(s), ErrCorrupt)
		}
		end := strings.IndexByte(s[1:], s[0])
		if end < 0 {
			return nil, fmt.Errorf(".npy header unterminated key: %w", ErrCorrupt)
		}
		key := s[1 : 1+end]
		s = strings.TrimLeft(s[2+end:], " ")
		if s == "" || s[0] != ':' {
			return nil, fmt.Errorf(".npy header key %q has no value: %w", key, ErrCorrupt)
		}
		s = strings.TrimLeft(s[1:], " ")
		var val string
		switch {
		case s == "":
			return nil, fmt.Errorf(".npy header key %q has no value: %w", key, ErrCorrupt)
		case s[0] == '(' || s[0] == '[':
			closer := map[byte]byte{'(': ')', '[': ']'}[s[0]]
			depth, i := 0, 0
			for ; i < len(s); i++ {
				if s[i] == s[0] {
					depth++
				} else if s[i] == closer {
					depth--
					if depth == 0 {
						break
					}
				}
			}
			if i == len(s) {
				return nil, fmt.Errorf(".npy header unterminated value of %q: %w", key, ErrCorrupt)
			}
			val, s = s[:i+1], s[i+1:]
		case s[0] == '\'' || s[0] == '"':
			end := strings.IndexByte(s[1:], s[0])
			if end < 0 {
				return nil, fmt.Errorf(".npy header unterminated value of %q: %w", key, ErrCorrupt)
			}
			val, s = s[:end+2], s[end+2:]
		default:
			i := strings.IndexByte(s, ',')
			if i < 0 {
				i = len(s)
			}
			val, s = strings.TrimSpace(s[:i]), s[i:]
		}
		out[key] = val
	}
}

func trunc(s string) string {
	if len(s) > 20 {
		return s[:20] + "..."
	}
	return s
}

// isObjectDtype says whether d is numpy's object dtype: "|O" as numpy
// writes it now, "|O8" (or "|O4") as older numpy wrote it with the size of
// a pointer.
func isObjectDtype(d string) bool {
	s := strings.TrimLeft(d, "<>|=")
	return s == "O" || s == "O4" || s == "O8"
}

// dtypeSize returns the item size of a simple numpy dtype string.
func dtypeSize(d string) (int, error) {
	if isObjectDtype(d) {
		return 0, fmt.Errorf("dtype %q is an object array: the file holds pickled Python objects, which riffle does not "+
			"unpickle (unpickling runs code, and a pickled row has no fixed size to read one by one; np.load needs "+
			"allow_pickle=True for it); save instead a fixed-dtype array (numbers, or fixed-width strings: "+
			"np.array(rows, dtype=\"U20\")), a structured dtype for rows of several fields, or one record per file "+
			"(a directory, or a WebDataset tar): %w", d, ErrUnsupported)
	}
	if len(d) < 2 {
		return 0, fmt.Errorf("dtype %q: %w", d, ErrUnsupported)
	}
	s := d
	if strings.ContainsRune("<>|=", rune(s[0])) {
		s = s[1:]
	}
	if len(s) < 2 {
		return 0, fmt.Errorf("dtype %q: %w", d, ErrUnsupported)
	}
	num := s[1:]
	if s[0] == 'm' || s[0] == 'M' {
		// datetime64 and timedelta64 carry a unit: '<M8[ns]'.
		if i := strings.IndexByte(num, '['); i > 0 && strings.HasSuffix(num, "]") {
			num = num[:i]
		}
	}
	n, err := strconv.Atoi(num)
	if err != nil || n <= 0 || n > 1<<20 {
		return 0, fmt.Errorf("dtype %q: %w", d, ErrUnsupported)
	}
	switch s[0] {
	case 'b', 'i', 'u', 'f', 'c', 'S', 'V', 'm', 'M':
		return n, nil
	case 'U':
		return 4 * n, nil
	}
	return 0, fmt.Errorf("dtype %q: %w", d, ErrUnsupported)
}
