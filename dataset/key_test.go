package dataset

import (
	"reflect"
	"testing"

	"github.com/riffle-ml/riffle/storage"
)

// notIdentity are the fields of Options that are not in Key, each with the
// reason: none changes which records an open has or their bytes.
var notIdentity = map[string]string{
	"IndexDir":       "where a sidecar index is kept, not what it says",
	"IndexInDirOnly": "where a sidecar index is kept, not what it says",
	"Index":          "whether a sidecar is reused, rebuilt or verified: a valid one says what a scan would",
	"Direct":         "how the records are read (O_DIRECT), not which: the daemon opens the two apart and names their records alike",
	"Store":          "what the paths are opened through; the daemon gives every open its one store",
	"Progress":       "who is told how far an index scan is",
}

// Every field of Options is in Key (a value other than the zero changes
// the key) or named in notIdentity (it does not): a field added to
// Options must be put in one of them, or sources opened with different
// records would share one name, or the same records two.
func TestOptionsKey(t *testing.T) {
	var zero Options
	typ := reflect.TypeOf(zero)
	for i := range typ.NumField() {
		f := typ.Field(i)
		var o Options
		set(t, f, reflect.ValueOf(&o).Elem().Field(i))
		why, apart := notIdentity[f.Name]
		switch changed := o.Key() != zero.Key(); {
		case apart && changed:
			t.Errorf("Options.%s changes Key, yet notIdentity says it is not identity (%s)", f.Name, why)
		case !apart && !changed:
			t.Errorf("Options.%s is neither in Key nor in notIdentity: add it to Key if it changes which records an open has or their bytes, else to notIdentity with the reason", f.Name)
		}
	}
	for name := range notIdentity {
		if _, ok := typ.FieldByName(name); !ok {
			t.Errorf("notIdentity names %s, which Options no longer has", name)
		}
	}
}

// set gives v, field f of an Options, a value other than its zero.
func set(t *testing.T, f reflect.StructField, v reflect.Value) {
	t.Helper()
	switch v.Kind() {
	case reflect.String:
		v.SetString("x")
	case reflect.Int, reflect.Int64:
		v.SetInt(1)
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Slice:
		if v.Type().Elem().Kind() != reflect.String {
			t.Fatalf("Options.%s: a %s; teach set a value of it", f.Name, v.Type())
		}
		v.Set(reflect.ValueOf([]string{"x"}))
	case reflect.Func:
		v.Set(reflect.MakeFunc(v.Type(), func([]reflect.Value) []reflect.Value { return nil }))
	case reflect.Interface:
		if v.Type() != reflect.TypeFor[storage.Store]() {
			t.Fatalf("Options.%s: a %s; teach set a value of it", f.Name, v.Type())
		}
		local, err := storage.NewLocal(false, nil)
		if err != nil {
			t.Fatal(err)
		}
		v.Set(reflect.ValueOf(local))
	default:
		t.Fatalf("Options.%s: a %s; teach set a value of it", f.Name, v.Type())
	}
}

// Key's text is what job's sourceKey wrote before it, so the daemon's
// names for records (cache spaces, share groups, between nodes) stay.
func TestOptionsKeyText(t *testing.T) {
	o := Options{Format: "fixed", RecordSize: 3072, HeaderBytes: 16, CSVHeader: true, DropPartialTail: true,
		Columns: []string{"image", "label"}, Split: "train", Extensions: []string{".jpg"}}
	if got, want := o.Key(), `fixed 3072 16 true false true ["image" "label"] "train" [".jpg"]`; got != want {
		t.Fatalf("key %s, want %s", got, want)
	}
	// Only as its count and the FNV-1a (64) of its quoted list, worked out
	// apart from Go: dd3de221f57edb21.
	o = Options{Only: []string{"a/1.jpg", "b/2.jpg"}}
	if got, want := o.Key(), ` 0 0 false false false [] "" [] only 2 dd3de221f57edb21`; got != want {
		t.Fatalf("key %s, want %s", got, want)
	}
	// An empty Only (a generation with no new files) is not no Only (every file).
	if (Options{Only: []string{}}).Key() == (Options{}).Key() {
		t.Fatal("an empty Only has the key of none")
	}
}
