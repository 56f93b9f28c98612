package storage

// RingFile is the local file an engine's read of r goes to io_uring
// through, if r has one: the ring path, for the tests of package
// storage_test.
func RingFile(r Reader) (*File, bool) {
	rf, ok := As[ringer](r)
	if !ok {
		return nil, false
	}
	f, release, err := rf.ringFile()
	if release != nil {
		release()
	}
	return f, err == nil
}
