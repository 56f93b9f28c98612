package order

import "testing"

func TestLastParts(t *testing.T) {
	for _, c := range []struct {
		name  string
		n     int
		whole bool
		want  string
	}{
		{"/d/tree/c2/002.png", 1, false, "002.png"},
		{"/d/tree/c2/002.png", 2, false, "c2/002.png"},
		{"/d/tree/c2/002.png", 3, false, "tree/c2/002.png"},
		{"/d/tree/c2/002.png", 9, false, "/d/tree/c2/002.png"},
		{"rel.jsonl", 2, false, "rel.jsonl"},
		{"/d/x.jsonl", 1, true, "/d/x.jsonl"},
	} {
		if got := lastParts(c.name, c.n, c.whole); got != c.want {
			t.Errorf("lastParts(%q, %d, %v) = %q, want %q", c.name, c.n, c.whole, got, c.want)
		}
	}
}
