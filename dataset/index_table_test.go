package dataset

import "testing"

// An offset table that a scan of its format could not have made is
// refused, each bound by its own error naming the record: offsets in
// order, within the source and on the format's alignment, each record
// spanning its frame at least, ends of their own in record order and
// inside their record past its head, and a table of exactly its words.
func TestOffsetTableBounds(t *testing.T) {
	key := indexKey{variant: 1, size: 100, version: 5}
	sh := shape{head: 12, min: 16, align: 4}
	sound := func() *table {
		return &table{offs: []int64{0, 16, 52, 100}, ends: []recordEnd{{1, 30}}}
	}
	for _, c := range []indexCase[*table]{
		{"as written", nil, nil, ""},
		{"offsets that go back", func(t *table) { t.offs[1], t.offs[2] = 52, 16 }, nil, "offset 16 of record 2 is out of order"},
		{"an offset past the source", func(t *table) { t.offs[3] = 104 }, nil, "offset 104 of record 3"},
		{"an offset below none", func(t *table) { t.offs[0] = -4 }, nil, "offset -4 of record 0"},
		{"an offset off its alignment", func(t *table) { t.offs[1] = 18 }, nil, "offset 18 of record 1"},
		{"a record narrower than its frame", func(t *table) { t.offs[3] = 52 }, nil, "record 2 spans 0 bytes"},
		{"an end past its record", func(t *table) { t.ends[0].end = 60 }, nil, "end 60 of record 1"},
		{"an end within its head", func(t *table) { t.ends[0].end = 20 }, nil, "end 20 of record 1"},
		{"an end of no record", func(t *table) { t.ends[0] = recordEnd{3, 100} }, nil, "end 100 of record 3"},
		{"ends out of record order", func(t *table) { t.ends = []recordEnd{{2, 80}, {1, 30}} }, nil, "end 30 of record 1 is out of order"},
		{"a word left over", nil, func(p []byte) []byte { return append(p, le(0)...) }, "index says 3 records and 1 exceptions but holds 56 bytes"},
		{"a word cut off", nil, func(p []byte) []byte { return p[:len(p)-8] }, "index says 3 records and 1 exceptions but holds 40 bytes"},
		{"a part of a word", nil, func(p []byte) []byte { return p[:len(p)-3] }, "not whole words"},
		{"no offsets", nil, func(p []byte) []byte { return p[:16] }, "too short"},
	} {
		tb := sound()
		payload := c.written(tb, func() []byte { // the table's words, without their frame
			b := writeIndex(key, *tb)
			return b[indexFrame : len(b)-4]
		})
		_, err := readIndex("t.ridx", frameIndex(key, payload), key, sh)
		c.check(t, err)
	}
}
