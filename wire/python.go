package wire

// The Python client mirrors this package line by line: the constants of
// wire.go (version, limits, ops, error kinds) and every message struct's
// field names are generated into python/riffle/wire.py by wire/gen, and
// TestPythonMirrorIsCurrent fails when that file is stale.

//go:generate go run ./gen
