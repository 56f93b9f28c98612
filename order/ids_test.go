package order

import (
	"encoding/binary"
	"errors"
	"slices"
	"strings"
	"testing"
)

// npyOf is a .npy of descr and shape holding data.
func npyOf(descr, shape string, data []byte) []byte {
	hdr := "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape + ", }"
	hdr += strings.Repeat(" ", 128-10-len(hdr)-1) + "\n"
	out := append([]byte("\x93NUMPY\x01\x00"), byte(len(hdr)), 0)
	return append(append(out, hdr...), data...)
}

func TestNpyIDs(t *testing.T) {
	be := binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint32(nil, 7), 70000)
	if ids, err := npyIDs("be.npy", npyOf(">u4", "(2,)", be)); err != nil || !slices.Equal(ids, []int{7, 70000}) {
		t.Fatalf("big-endian uint32: %v %v", ids, err)
	}
	le := binary.LittleEndian.AppendUint16(binary.LittleEndian.AppendUint16(nil, 3), 65535)
	if ids, err := npyIDs("le.npy", npyOf("<u2", "(2,)", le)); err != nil || !slices.Equal(ids, []int{3, 65535}) {
		t.Fatalf("uint16: %v %v", ids, err)
	}
	for name, b := range map[string][]byte{
		"negative": npyOf("|i1", "(2,)", []byte{1, 0xff}),
		"2-D":      npyOf("<i8", "(1, 1)", make([]byte, 8)),
		"floats":   npyOf("<f8", "(1,)", make([]byte, 8)),
		"short":    npyOf("<i8", "(3,)", make([]byte, 16)),
	} {
		if _, err := npyIDs(name, b); err == nil {
			t.Errorf("%s: no error", name)
		} else if !errors.Is(err, ErrSpec) && !strings.Contains(err.Error(), name) {
			t.Errorf("%s: %v does not name the file", name, err)
		}
	}
}
