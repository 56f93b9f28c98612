package dataset

// SetDecodedBudget makes the datasets opened after it keep at most n bytes
// of decoded blocks, until the returned function restores the budget: a
// test's small file then outgrows the cache as a large one would.
func SetDecodedBudget(n int64) (restore func()) {
	old := decodedBudget
	decodedBudget = n
	return func() { decodedBudget = old }
}
