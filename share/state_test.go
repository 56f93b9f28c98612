package share

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"testing"

	"github.com/RoaringBitmap/roaring/v2"

	"github.com/riffle-ml/riffle/sampler"
)

// memberState is a member's state (Save's format) of the set done and the
// tail, with the header's fields as given: a forger's.
func memberState(epoch, pos, size int, done *roaring.Bitmap, tail []int) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "%s%d %d %d %d\n", memberMagic, epoch, pos, size, len(tail))
	done.RunOptimize()
	done.WriteTo(&b)
	for _, e := range tail {
		b.Write(binary.AppendUvarint(nil, uint64(e)))
	}
	return b.Bytes()
}

// allocated is the bytes f allocates.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// A forged state is refused by the dataset it claims to describe before
// anything is allocated for what it claims: a run of 2^27 records (a few
// KB of roaring runs, which asked for 1 GiB) or of 2^31 (16 GiB) in a
// state of a dataset of 1,000; a tail of 2^30 records in a few bytes; a
// client's state nested a million deep (which ran the stack out); and
// roaring containers whose runs overlap, whose keys go back, or whose
// counts lie.
func TestForgedStatesAreRefused(t *testing.T) {
	const records = 1000
	run := func(n uint64) *roaring.Bitmap {
		b := roaring.New()
		b.AddRange(0, n)
		return b
	}
	// A client's state holding one holding one ..., a million deep: each
	// header says the length of all inside it.
	base := append([]byte("RFSHR2\x000 0 1000 0\n"), must(roaring.New().ToBytes())...)
	heads, n := make([][]byte, 1_000_000), len(base)
	for k := range heads {
		heads[k] = fmt.Appendf(nil, "%s0 1000 %d\n", bitsMagic, n)
		n += len(heads[k])
	}
	nested := make([]byte, 0, n)
	for k := len(heads) - 1; k >= 0; k-- {
		nested = append(nested, heads[k]...)
	}
	nested = append(nested, base...)
	// Hand-made containers of one key: a run container's runs, an array.
	container := func(runs bool, key uint16, vals ...uint16) []byte {
		b := binary.LittleEndian.AppendUint32(nil, 12347) // one container
		if runs {
			b = append(b, 1)
		} else {
			b = append(b, 0)
		}
		card := len(vals)
		if runs {
			card = 0
			for i := 1; i < len(vals); i += 2 {
				card += int(vals[i]) + 1
			}
		}
		b = binary.LittleEndian.AppendUint16(b, key)
		b = binary.LittleEndian.AppendUint16(b, uint16(card-1))
		if runs {
			b = binary.LittleEndian.AppendUint16(b, uint16(len(vals)/2))
		}
		for _, v := range vals {
			b = binary.LittleEndian.AppendUint16(b, v)
		}
		return b
	}
	raw := func(head string, set []byte) []byte { return append([]byte(head), set...) }
	for name, state := range map[string][]byte{
		"a run of 2^27":           memberState(0, 1<<27, records, run(1<<27), nil),
		"a run of 2^31":           memberState(0, 1<<31-1, records, run(1<<31-1), nil),
		"a set of 2^27":           append([]byte(fmt.Sprintf("%s0 %d\n", setMagic, 1<<27)), must(run(1<<27).ToBytes())...),
		"a tail of 2^30":          memberState(0, 1<<30, records, roaring.New(), []int{1, 2, 3}),
		"a tail past the dataset": memberState(0, 1, records, roaring.New(), []int{records}),
		"a tail twice":            memberState(0, 3, records, roaring.BitmapOf(1), []int{2, 2}),
		"nested a million deep":   nested,
		"overlapping runs":        raw("RFSET1\x000 12\n", container(true, 0, 10, 5, 12, 5)),
		"a run past its key":      raw("RFSET1\x000 10\n", container(true, 0, 65530, 9)),
		"an array out of order":   raw("RFSET1\x000 3\n", container(false, 0, 5, 4, 6)),
		"a key past the dataset":  raw("RFSET1\x000 1\n", container(false, 1, 0)),
		"a cookie":                raw("RFSET1\x000 1\n", []byte{1, 2, 3, 4, 5, 6, 7, 8}),
		"a header of digits":      []byte("RFSHR2\x00" + string(bytes.Repeat([]byte("9"), 1<<20)) + " 1 1 1\n"),
		"bits past the dataset":   append([]byte(fmt.Sprintf("%s0 %d 0\n", bitsMagic, records)), bytes.Repeat([]byte{1}, 1<<20)...),
		"an epoch of 2^62":        memberState(1<<62, 0, records, roaring.New(), nil),
	} {
		var err error
		if n := allocated(func() { _, err = Delivered(state, records) }); n > 32<<20 {
			t.Errorf("%s: %d MiB allocated to refuse a state of %d KiB", name, n>>20, len(state)>>10)
		}
		if !errors.Is(err, sampler.ErrState) {
			t.Errorf("%s: %v, want ErrState", name, err)
		}
		g := NewGroup(Options{Records: records, Seed: 1})
		m, _ := g.Join(nil, 0)
		if _, _, err := m.Restore(state); !errors.Is(err, sampler.ErrState) {
			t.Errorf("%s: restored (%v)", name, err)
		}
		m.Leave()
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// A state of any bytes is an error wrapping ErrState, or what it says
// delivered lies in the dataset: a set of ids below its records, a tail
// of others, each once, and a size no larger; and restoring it into a
// member of a group over those records never panics.
func FuzzDelivered(f *testing.F) {
	g := NewGroup(Options{Records: 100, Seed: 5})
	m, _ := g.Join(rangeSet(10, 100), 0)
	head := make([]int, 30)
	m.Fill(0, 0, head)
	st, err := m.SaveFrom(m.Mark(), 20)
	if err != nil {
		f.Fatal(err)
	}
	whole, err := m.Save(m.Mark())
	if err != nil {
		f.Fatal(err)
	}
	m.Leave()
	f.Add(st)
	f.Add(memberState(0, 3, 90, roaring.BitmapOf(10, 11), []int{40}))
	f.Add(append([]byte("RFSHR1\x000 2 90\n"), must(roaring.BitmapOf(12, 99).ToBytes())...))
	set, _ := EncodeDelivered(1, rangeSet(10, 60))
	f.Add(set)
	f.Add(append(fmt.Appendf(nil, "%s0 90 %d\n", bitsMagic, len(whole)), append(whole, 0, 0, 0x10)...))
	f.Add([]byte(bitsMagic + "0 90 0\n\x01\x02"))
	f.Fuzz(func(t *testing.T, state []byte) {
		const records = 100
		s, err := Delivered(state, records)
		if err != nil {
			if !errors.Is(err, sampler.ErrState) {
				t.Fatalf("error %v is not ErrState", err)
			}
			return
		}
		if s.Size < 0 || s.Size > records || s.Epoch < 0 {
			t.Fatalf("accepted size %d epoch %d", s.Size, s.Epoch)
		}
		if !s.Done.IsEmpty() && s.Done.Maximum() >= records {
			t.Fatalf("accepted record %d of %d", s.Done.Maximum(), records)
		}
		if err := s.Done.Validate(); err != nil {
			t.Fatalf("accepted a set roaring itself refuses: %v", err)
		}
		seen := s.Done.Clone()
		for _, e := range s.Tail {
			if e < 0 || e >= records || !seen.CheckedAdd(uint32(e)) {
				t.Fatalf("accepted tail %v over set %v", s.Tail, s.Done.ToArray())
			}
		}
		g := NewGroup(Options{Records: records, Seed: 5})
		m, _ := g.Join(rangeSet(10, 100), 0)
		defer m.Leave()
		if e, pos, err := m.Restore(state); err == nil {
			rest := make([]int, 90-pos)
			if n := m.Fill(e, pos, rest); n != len(rest) {
				t.Fatalf("restored at %d of 90, filled %d of the %d left", pos, n, len(rest))
			}
			var got []int
			for _, e := range s.Done.ToArray() {
				got = append(got, int(e))
			}
			isPermutationOf(t, append(append(got, s.Tail...), rest...), rangeSet(10, 100), records)
		}
	})
}
