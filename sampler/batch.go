package sampler

// Batches cuts an epoch of Len positions into consecutive batches of Size.
// With DropLast a final short batch is dropped, as DataLoader's drop_last.
type Batches struct {
	Len, Size int
	DropLast  bool
}

// Count is the number of batches per epoch.
func (b Batches) Count() int {
	if b.Size <= 0 {
		return 0
	}
	if b.DropLast {
		return b.Len / b.Size
	}
	return (b.Len + b.Size - 1) / b.Size
}

// Span returns batch i's first position and its number of records.
func (b Batches) Span(i int) (pos, n int) {
	pos = i * b.Size
	return pos, min(b.Size, b.Len-pos)
}
