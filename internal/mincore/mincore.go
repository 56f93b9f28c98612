// Package mincore says which pages of a file the page cache holds: for
// the storage engine's copies from a mapping (storage/mapped.go), and for
// tests of what reads leave there.
package mincore

import (
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// PageSize is the unit of the answer.
const PageSize = 4096

// File says which of the pages of the file at path the page cache holds.
func File(path string) ([]bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	return Fd(int(f.Fd()), st.Size())
}

// Fd says which of the pages of size bytes of the open file fd the page
// cache holds.
func Fd(fd int, size int64) ([]bool, error) {
	if size == 0 {
		return nil, nil
	}
	m, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("mincore: mmap: %w", err)
	}
	defer unix.Munmap(m)
	vec, err := Mapped(m)
	if err != nil {
		return nil, err
	}
	in := make([]bool, len(vec))
	for i, v := range vec {
		in[i] = v&1 != 0
	}
	return in, nil
}

// Mapped is mincore(2) of a mapping: bit 0 of byte i says its page i is
// in the page cache.
func Mapped(mem []byte) ([]byte, error) {
	vec := make([]byte, (len(mem)+PageSize-1)/PageSize)
	if len(mem) == 0 {
		return vec, nil
	}
	// x/sys has no wrapper for mincore(2).
	if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(unsafe.SliceData(mem))), uintptr(len(mem)),
		uintptr(unsafe.Pointer(unsafe.SliceData(vec)))); e != 0 {
		return nil, fmt.Errorf("mincore: %w", e)
	}
	return vec, nil
}
