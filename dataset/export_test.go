package dataset

// SetUnpackedBudget makes the datasets opened after it keep at most n bytes
// of unpacked blocks, until the returned function restores the budget: a
// test's small file then outgrows the cache as a large one would.
func SetUnpackedBudget(n int64) (restore func()) {
	old := unpackedBudget
	unpackedBudget = n
	return func() { unpackedBudget = old }
}
