package order

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"

	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/storage"
)

// MaxSubsetIDs bounds the ids a subset names, given or in a file.
const MaxSubsetIDs = 1 << 24

// maxIDsFile bounds an ids file: 2^24 ids of 8 bytes, or as many lines.
const maxIDsFile = 1 << 28

// readIDs reads a file of ids: a one-dimensional integer .npy, or text of
// one id per line (blank lines and # comments skipped).
func readIDs(ctx context.Context, store storage.Store, name string) ([]int, error) {
	b, err := store.ReadFile(ctx, name, maxIDsFile)
	if err != nil {
		return nil, fmt.Errorf("subset ids_file: %w", err)
	}
	return parseIDs(name, b)
}

// parseIDs reads the ids of the ids file name, whose bytes are b.
func parseIDs(name string, b []byte) ([]int, error) {
	if bytes.HasPrefix(b, []byte("\x93NUMPY")) {
		return npyIDs(name, b)
	}
	var ids []int
	line := 0
	for len(b) > 0 {
		var l []byte
		l, b, _ = bytes.Cut(b, []byte("\n"))
		line++
		t := strings.TrimSpace(string(l))
		if t == "" || strings.HasPrefix(t, "#") {
			continue
		}
		id, err := strconv.ParseInt(t, 10, 64)
		if err != nil || id < 0 {
			return nil, fmt.Errorf("%w: %s line %d: %q is not an id (want one non-negative integer per line, or an integer .npy)", ErrSpec, name, line, t)
		}
		if len(ids) >= MaxSubsetIDs {
			return nil, specErr("%s: more than %d ids", name, MaxSubsetIDs)
		}
		ids = append(ids, int(id))
	}
	return ids, nil
}

func npyIDs(name string, b []byte) ([]int, error) {
	h, err := dataset.ParseNpyHeader(b)
	if err != nil {
		return nil, &dataset.FormatError{Path: name, Err: err}
	}
	if len(h.Shape) != 1 || h.FortranOrder && len(h.Shape) > 1 {
		return nil, specErr("%s: an array of shape %v, want one dimension of ids", name, h.Shape)
	}
	kind, size := h.Descr[1:2], h.ItemSize
	big := h.Descr[0] == '>'
	if (kind != "i" && kind != "u") || size > 8 {
		return nil, specErr("%s: ids of dtype %q, want integers", name, h.Descr)
	}
	n := h.Shape[0]
	if n > MaxSubsetIDs {
		return nil, specErr("%s: %d ids, at most %d", name, n, MaxSubsetIDs)
	}
	data := b[h.DataOffset:]
	if len(data) < n*size {
		return nil, &dataset.FormatError{Path: name, Offset: int64(len(b)), Err: fmt.Errorf("%d ids of %d bytes need %d bytes after the header: %w", n, size, n*size, dataset.ErrPartial)}
	}
	ids := make([]int, n)
	var order binary.ByteOrder = binary.LittleEndian
	if big {
		order = binary.BigEndian
	}
	for i := range ids {
		c := data[i*size : (i+1)*size]
		var v int64
		switch size {
		case 1:
			v = int64(c[0])
			if kind == "i" {
				v = int64(int8(c[0]))
			}
		case 2:
			v = int64(order.Uint16(c))
			if kind == "i" {
				v = int64(int16(order.Uint16(c)))
			}
		case 4:
			v = int64(order.Uint32(c))
			if kind == "i" {
				v = int64(int32(order.Uint32(c)))
			}
		case 8:
			u := order.Uint64(c)
			if kind == "u" && u > 1<<62 {
				return nil, specErr("%s: id %d at index %d is not a record", name, u, i)
			}
			v = int64(u)
		default:
			return nil, specErr("%s: ids of %d bytes", name, size)
		}
		if v < 0 {
			return nil, specErr("%s: id %d at index %d is negative", name, v, i)
		}
		ids[i] = int(v)
	}
	return ids, nil
}
