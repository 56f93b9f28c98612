package dataset

import (
	"bytes"
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/riffle-ml/riffle/storage"
)

// WebDataset tar shards: a sample is the run of consecutive members whose
// names share a key (the name up to the first dot of its last element:
// "train/0001.jpg" and "train/0001.cls" make sample "train/0001"), as the
// webdataset library groups them. A record is a sample's bytes, from its
// first member's header to its last member's data: members of a sample
// are consecutive, so a sample is one range, read with one read. One scan
// of the headers (reading only headers, not members' data) builds the
// offset table; riffle.decode.tar_sample gives the dict of extension to
// bytes that webdataset gives.

func init() {
	RegisterFormat(Format{Name: "tar", Extensions: []string{".tar"}, Indexed: true, OpenPart: openTar})
}

const tarBlock = 512

// tarHeader is what the scan needs of one header block.
type tarHeader struct {
	name string
	size int64
	flag byte
}

// parseTarHeader reads a ustar (or GNU, or v7) header block, checking its
// checksum.
func parseTarHeader(b []byte) (tarHeader, error) {
	var h tarHeader
	sum, err := parseOctal(b[148:156])
	if err != nil {
		return h, fmt.Errorf("header checksum field %q", b[148:156])
	}
	var unsigned, signed int64
	for i, c := range b[:tarBlock] {
		if i >= 148 && i < 156 {
			c = ' '
		}
		unsigned += int64(c)
		signed += int64(int8(c))
	}
	if sum != unsigned && sum != signed {
		return h, fmt.Errorf("header checksum %d, computed %d", sum, unsigned)
	}
	h.flag = b[156]
	if h.size, err = parseNumeric(b[124:136]); err != nil || h.size < 0 {
		return h, fmt.Errorf("member size field %q", b[124:136])
	}
	h.name = cstring(b[0:100])
	if string(b[257:262]) == "ustar" {
		if prefix := cstring(b[345:500]); prefix != "" {
			h.name = prefix + "/" + h.name
		}
	}
	return h, nil
}

func cstring(b []byte) string {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}

func parseOctal(b []byte) (int64, error) {
	s := strings.Trim(string(b), " \x00")
	if s == "" {
		return 0, nil
	}
	return strconv.ParseInt(s, 8, 64)
}

// parseNumeric reads an octal field, or GNU's base-256 form for sizes
// past 8 GiB.
func parseNumeric(b []byte) (int64, error) {
	if len(b) > 0 && b[0]&0x80 != 0 {
		var v int64
		for i, c := range b {
			if i == 0 {
				c &= 0x7f
			}
			if v > (1<<62)>>8 {
				return 0, fmt.Errorf("size overflows")
			}
			v = v<<8 | int64(c)
		}
		return v, nil
	}
	return parseOctal(b)
}

// tarKeyRE is webdataset's split of a member's name into its sample's key
// and its extension (base_plus_ext): the key runs to the first dot of the
// last element, and a name with no dot there belongs to no sample.
var tarKeyRE = regexp.MustCompile(`^((?:.*/|)[^.]+)[.]([^/]*)$`)

// tarKey is webdataset's key of a member, and false for a member that is
// in no sample (no extension, or a "__name__" meta file at the top).
func tarKey(name string) (string, bool) {
	if !strings.Contains(name, "/") && strings.HasPrefix(name, "__") && strings.HasSuffix(name, "__") {
		return "", false
	}
	m := tarKeyRE.FindStringSubmatch(name)
	if m == nil {
		return "", false
	}
	return m[1], true
}

// tarScan walks a tar's headers and returns the offset table of its
// samples.
func tarScan(ctx context.Context, f storage.Reader, opts Options) (table, error) {
	size := f.Size()
	bad := func(off int64, format string, args ...any) error {
		return &FormatError{Path: f.Name(), Offset: off, Err: fmt.Errorf(format+": %w", append(args, ErrCorrupt)...)}
	}
	// Headers are read through a window, so small members cost one read
	// for many headers and large ones are skipped over.
	var win []byte
	winOff := int64(-1)
	block := func(off int64) ([]byte, error) {
		if winOff < 0 || off < winOff || off+tarBlock > winOff+int64(len(win)) {
			n := min(int64(64<<10), size-off)
			win = make([]byte, n)
			if err := f.ReadAt(ctx, win, off); err != nil {
				return nil, err
			}
			winOff = off
		}
		return win[off-winOff : off-winOff+tarBlock], nil
	}
	var t table
	key := ""
	sampleEnd := int64(-1) // padded end of the current sample's last member
	pending := int64(-1)   // start of the headers of the member being read
	longName := ""
	off := int64(0)
	for {
		if err := ctx.Err(); err != nil {
			return table{}, err
		}
		if off+tarBlock > size {
			if off == size && size > 0 {
				break // no end-of-archive blocks: accept, as tar does
			}
			return table{}, bad(off, "tar header cut short (file of %d bytes)", size)
		}
		b, err := block(off)
		if err != nil {
			return table{}, err
		}
		if bytes.Count(b, []byte{0}) == tarBlock {
			break // end of archive
		}
		h, err := parseTarHeader(b)
		if err != nil {
			return table{}, bad(off, "%v", err)
		}
		if pending < 0 {
			pending = off
		}
		dataAt := off + tarBlock
		next := dataAt + (h.size+tarBlock-1)/tarBlock*tarBlock
		if dataAt+h.size > size {
			if opts.DropPartialTail {
				break
			}
			return table{}, &FormatError{Path: f.Name(), Offset: off, Err: fmt.Errorf(
				"member %q of %d bytes is cut short (file ends at %d; --drop-partial or drop_partial=True drops it): %w", h.name, h.size, size, ErrPartial)}
		}
		switch h.flag {
		case 'L': // GNU long name: the next header's name is this member's data
			if h.size > 1<<16 {
				return table{}, bad(off, "long name of %d bytes", h.size)
			}
			nb := make([]byte, h.size)
			if err := f.ReadAt(ctx, nb, dataAt); err != nil {
				return table{}, err
			}
			longName = cstring(nb)
			off = next
			continue
		case 'x': // pax extended header: path= overrides the name
			if h.size > 1<<20 {
				return table{}, bad(off, "pax header of %d bytes", h.size)
			}
			pb := make([]byte, h.size)
			if err := f.ReadAt(ctx, pb, dataAt); err != nil {
				return table{}, err
			}
			if p, ok := paxPath(pb); ok {
				longName = p
			}
			off = next
			continue
		case 'g', 'K': // global pax header, GNU long link: nothing for samples
			off = next
			pending = -1
			continue
		}
		name := h.name
		if longName != "" {
			name, longName = longName, ""
		}
		k, member := tarKey(name)
		if h.flag != '0' && h.flag != 0 && h.flag != '7' || !member {
			// Directories, links and names without an extension belong
			// to no sample.
			off, pending = next, -1
			continue
		}
		if k != key || len(t.offs) == 0 {
			if len(t.offs) > 0 && pending != sampleEnd {
				t.ends = append(t.ends, recordEnd{record: len(t.offs) - 1, end: sampleEnd})
			}
			t.offs = append(t.offs, pending)
			key = k
		}
		// A sample runs to its last member's padded end, where the next
		// sample's headers usually start.
		sampleEnd = min(next, size)
		pending = -1
		off = next
		if opts.Progress != nil {
			opts.Progress(off, size)
		}
	}
	if len(t.offs) == 0 {
		return table{}, nil
	}
	t.offs = append(t.offs, sampleEnd)
	return t, nil
}

// paxPath finds the path record of a pax header ("LEN path=VALUE\n").
func paxPath(b []byte) (string, bool) {
	for len(b) > 0 {
		sp := bytes.IndexByte(b, ' ')
		if sp <= 0 {
			return "", false
		}
		n, err := strconv.Atoi(string(b[:sp]))
		if err != nil || n <= sp || n > len(b) {
			return "", false
		}
		rec := b[sp+1 : n]
		if v, ok := bytes.CutPrefix(rec, []byte("path=")); ok {
			return strings.TrimSuffix(string(v), "\n"), true
		}
		b = b[n:]
	}
	return "", false
}

func openTar(ctx context.Context, f storage.Reader, opts Options) (Part, error) {
	variant := uint32(7)
	if opts.DropPartialTail {
		variant |= 1 << 8
	}
	t, err := loadOrBuild(ctx, f, variant, opts, shape{min: tarBlock, align: tarBlock}, func() (table, error) { return tarScan(ctx, f, opts) })
	if err != nil {
		return nil, err
	}
	return &offsetPart{t: t}, nil
}
