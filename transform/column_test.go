package transform

import "testing"

// column= is every transform's parameter on rows: kept in the canonical
// spelling (so outputs of different columns are keyed apart), never empty,
// and written back only for names the spec's syntax holds.
func TestColumnParam(t *testing.T) {
	_, key, err := New("image:size=64,crop=32,column=img")
	if err != nil || key != "image:column=img,crop=32,size=64@v2" {
		t.Fatalf("key %q, %v", key, err)
	}
	if c := Column("random_resized_crop:column=picture"); c != "picture" {
		t.Fatalf("column %q", c)
	}
	if c := Column("image:size=64,crop=32"); c != "" {
		t.Fatalf("column %q of a spec naming none", c)
	}
	if _, _, err := New("image:column="); err == nil {
		t.Fatal("an empty column= accepted")
	}
	s, err := WithColumn("image:size=64,crop=32", "image")
	if err != nil || s != "image:column=image,crop=32,size=64" {
		t.Fatalf("WithColumn: %q %v", s, err)
	}
	if s, err := WithColumn("image:column=a", "b"); err != nil || Column(s) != "b" {
		t.Fatalf("WithColumn over another: %q %v", s, err)
	}
	for _, bad := range []string{"a,b", "x=y", "c:d", ""} {
		if _, err := WithColumn("image", bad); err == nil {
			t.Errorf("column %q written into a spec", bad)
		}
	}
}
