// Package alignbuf allocates byte slices whose first byte is aligned, as
// O_DIRECT reads require.
package alignbuf

import "unsafe"

// Make returns a slice of n bytes starting at a multiple of align (a power
// of two). Its capacity is n.
func Make(n, align int) []byte {
	if align <= 1 {
		return make([]byte, n)
	}
	b := make([]byte, n+align)
	shift := 0
	if r := int(uintptr(unsafe.Pointer(unsafe.SliceData(b))) & uintptr(align-1)); r != 0 {
		shift = align - r
	}
	return b[shift : shift+n : shift+n]
}

// Aligned reports whether b starts at a multiple of align.
func Aligned(b []byte, align int) bool {
	return align <= 1 || uintptr(unsafe.Pointer(unsafe.SliceData(b)))&uintptr(align-1) == 0
}
