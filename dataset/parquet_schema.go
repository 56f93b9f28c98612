package dataset

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/parquet"
	"github.com/apache/arrow-go/v18/parquet/metadata"
	"github.com/apache/arrow-go/v18/parquet/pqarrow"
	"github.com/apache/arrow-go/v18/parquet/schema"

	"github.com/riffle-ml/riffle/columnar"
)

// hfFeatures is the Hugging Face features a file written by datasets
// (Dataset.to_parquet, the Hub's files) keeps under its "huggingface" key,
// as dataset_info.json's "features" are for a save_to_disk directory: how a
// client knows which columns are Images and what a ClassLabel's names are.
// An Arrow file written by datasets (save_to_disk's, and a pack of any of
// these) keeps the same key in its schema's metadata.
func hfFeatures(v *string) string {
	if v == nil {
		return ""
	}
	var meta struct {
		Info struct {
			Features json.RawMessage `json:"features"`
		} `json:"info"`
	}
	var b bytes.Buffer
	if json.Unmarshal([]byte(*v), &meta) != nil || len(meta.Info.Features) == 0 || json.Compact(&b, meta.Info.Features) != nil {
		return ""
	}
	return b.String()
}

// columnsOf lays out the file's readable top-level columns, and returns
// the fields of the others.
func columnsOf(meta *metadata.FileMetaData) ([]*pqColumn, []arrow.Field, error) {
	kv := meta.KeyValueMetadata()
	if err := checkStoredSchema(kv); err != nil {
		return nil, nil, err
	}
	man, err := pqarrow.NewSchemaManifest(meta.Schema, kv, &pqarrow.ArrowReadProperties{})
	if err != nil {
		return nil, nil, err
	}
	var cols []*pqColumn
	var skipped []arrow.Field
	root := meta.Schema.Root()
	for i, f := range man.Fields {
		var leaves []int // in the file's order, which is the type's pre-order
		var walk func(s *pqarrow.SchemaField)
		walk = func(s *pqarrow.SchemaField) {
			if s.IsLeaf() {
				leaves = append(leaves, s.ColIndex)
			}
			for k := range s.Children {
				walk(&s.Children[k])
			}
		}
		walk(&man.Fields[i])
		if len(leaves) == 0 {
			skipped = append(skipped, *f.Field)
			continue
		}
		var group []int
		if len(leaves) > 1 {
			group = leaves
		}
		int96 := make([]bool, len(leaves))
		for k, l := range leaves {
			int96[k] = meta.Schema.Column(l).PhysicalType() == parquet.Types.Int96
		}
		field := *f.Field
		// Read dense, as every other column: a batch's dictionary would be
		// the page's, not the file's.
		field.Type = denseType(field.Type)
		var origin arrow.DataType
		if man.OriginSchema != nil {
			if fs, ok := man.OriginSchema.FieldsByName(field.Name); ok && len(fs) == 1 {
				origin = fs[0].Type
			}
		}
		field.Type = timestampsAsPyarrow(field.Type, origin, &int96)
		one := arrow.NewSchema([]arrow.Field{field}, nil)
		lay, bad, err := columnar.NewLayout(one, nil)
		if err != nil || len(bad) > 0 {
			skipped = append(skipped, *f.Field)
			continue
		}
		g, err := schema.NewGroupNode("schema", parquet.Repetitions.Repeated, schema.FieldList{root.Field(i)}, -1)
		if err != nil {
			return nil, nil, err
		}
		// The page is decoded as the schema stored with it says; arrow-go
		// reads no durations, which are int64s of the same layout.
		sb, err := columnar.SchemaBytes(arrow.NewSchema([]arrow.Field{{Name: field.Name, Type: decodeType(field.Type), Nullable: field.Nullable}}, nil))
		if err != nil {
			return nil, nil, err
		}
		ckv := metadata.NewKeyValueMetadata()
		ckv.Append("ARROW:schema", base64.StdEncoding.EncodeToString(sb[:len(sb)-8]))
		cols = append(cols, &pqColumn{name: field.Name, leaf: leaves[0], group: group, field: field, lay: lay, sub: schema.NewSchema(g), kv: ckv})
	}
	return cols, skipped, nil
}

// checkStoredSchema checks the Arrow schema a writer stored in the footer
// (the ARROW:schema key) with riffle's own flatbuffer reader, which bounds
// every vector by the bytes that hold it, before arrow-go's reads it:
// arrow-go sizes what it allocates by the counts the schema claims, and a
// corrupt count runs the process out of memory, which no recover catches.
func checkStoredSchema(kv metadata.KeyValueMetadata) error {
	v := kv.FindValue("ARROW:schema")
	if v == nil {
		return nil
	}
	b, err := base64.StdEncoding.DecodeString(*v)
	if len(b) == 0 || err != nil {
		b, err = base64.RawStdEncoding.DecodeString(*v)
	}
	if err != nil {
		return fmt.Errorf("stored Arrow schema: %v", err)
	}
	n, pre, eos, err := columnar.Prefix(b)
	if err == nil && (eos || n > len(b)-pre) {
		err = fmt.Errorf("a message of %d bytes in %d", n, len(b))
	}
	if err == nil {
		_, err = columnar.ParseSchemaMessage(b[pre : pre+n])
	}
	if err == nil {
		var m *columnar.Message
		if m, err = columnar.ParseMessage(b[pre : pre+n]); err == nil && m.BodyLen > int64(len(b)-pre-n) {
			err = fmt.Errorf("a body of %d bytes after the schema, in %d", m.BodyLen, len(b)-pre-n)
		}
	}
	if err != nil {
		return fmt.Errorf("stored Arrow schema: %v", err)
	}
	return nil
}

// timestampsAsPyarrow gives a column's timestamps the type pyarrow reads
// them as where arrow-go's differs (Arrow C++'s parquet/arrow/schema.cc,
// ApplyOriginalStorageMetadata): an INT96 timestamp is timestamp[ns] with
// no zone (arrow-go says UTC), and a UTC-adjusted timestamp takes the zone
// its stored Arrow schema (origin, the ARROW:schema key) gave it even when
// its unit was coerced on write (arrow-go keeps the zone only when the
// unit is the same). The values are the same int64s either way. int96
// says, for each leaf of t in pre-order (the file's order of its leaf
// columns), whether it is stored as INT96; each leaf takes its own.
func timestampsAsPyarrow(t, origin arrow.DataType, int96 *[]bool) arrow.DataType {
	field := func(e arrow.Field, o arrow.DataType) arrow.Field {
		e.Type = timestampsAsPyarrow(e.Type, o, int96)
		return e
	}
	elem := func(o arrow.DataType) arrow.DataType {
		if ol, ok := o.(arrow.ListLikeType); ok {
			return ol.Elem()
		}
		return nil
	}
	switch tt := t.(type) {
	case *arrow.ListType:
		return arrow.ListOfField(field(tt.ElemField(), elem(origin)))
	case *arrow.LargeListType:
		return arrow.LargeListOfField(field(tt.ElemField(), elem(origin)))
	case *arrow.FixedSizeListType:
		return arrow.FixedSizeListOfField(tt.Len(), field(tt.ElemField(), elem(origin)))
	case *arrow.MapType:
		// pyarrow (22) gives a map's timestamps no zone back from the
		// stored schema: a UTC-adjusted one is UTC there, whatever zone
		// it was written with (arrow-go keeps the zone when the unit is
		// the same).
		m := arrow.MapOfFields(field(tt.KeyField(), nil), field(tt.ItemField(), nil))
		m.KeysSorted = tt.KeysSorted
		return mapLeaves(m, func(t arrow.DataType) arrow.DataType {
			if ts, ok := t.(*arrow.TimestampType); ok && ts.TimeZone != "" {
				return &arrow.TimestampType{Unit: ts.Unit, TimeZone: "UTC"}
			}
			return t
		})
	case *arrow.StructType:
		os, _ := origin.(*arrow.StructType)
		fs := make([]arrow.Field, tt.NumFields())
		for k, f := range tt.Fields() {
			var o arrow.DataType
			if os != nil && os.NumFields() == len(fs) {
				o = os.Field(k).Type
			}
			fs[k] = field(f, o)
		}
		return arrow.StructOf(fs...)
	}
	is96 := false
	if len(*int96) > 0 {
		is96, *int96 = (*int96)[0], (*int96)[1:]
	}
	if tt, ok := t.(*arrow.TimestampType); ok {
		if is96 {
			return &arrow.TimestampType{Unit: arrow.Nanosecond}
		}
		if ot, ok := origin.(*arrow.TimestampType); ok && tt.TimeZone == "UTC" && ot.TimeZone != "" {
			return &arrow.TimestampType{Unit: tt.Unit, TimeZone: ot.TimeZone}
		}
	}
	return t
}

// mapLeaves rebuilds a nested type with fn applied to each of its leaf
// types (those neither a list, a map nor a struct).
func mapLeaves(t arrow.DataType, fn func(arrow.DataType) arrow.DataType) arrow.DataType {
	field := func(f arrow.Field) arrow.Field {
		f.Type = mapLeaves(f.Type, fn)
		return f
	}
	switch tt := t.(type) {
	case *arrow.ListType:
		return arrow.ListOfField(field(tt.ElemField()))
	case *arrow.LargeListType:
		return arrow.LargeListOfField(field(tt.ElemField()))
	case *arrow.FixedSizeListType:
		return arrow.FixedSizeListOfField(tt.Len(), field(tt.ElemField()))
	case *arrow.MapType:
		m := arrow.MapOfFields(field(tt.KeyField()), field(tt.ItemField()))
		m.KeysSorted = tt.KeysSorted
		return m
	case *arrow.StructType:
		fs := make([]arrow.Field, tt.NumFields())
		for k, f := range tt.Fields() {
			fs[k] = field(f)
		}
		return arrow.StructOf(fs...)
	}
	return fn(t)
}

// denseType is t with every dictionary read as its values.
func denseType(t arrow.DataType) arrow.DataType {
	return mapLeaves(t, func(t arrow.DataType) arrow.DataType {
		if dt, ok := t.(*arrow.DictionaryType); ok {
			return dt.ValueType
		}
		return t
	})
}

// decodeType is the type a page of type t is decoded as: t, but for
// durations (read as the int64s they are stored as).
func decodeType(t arrow.DataType) arrow.DataType {
	return mapLeaves(t, func(t arrow.DataType) arrow.DataType {
		if _, ok := t.(*arrow.DurationType); ok {
			return arrow.PrimitiveTypes.Int64
		}
		return t
	})
}

func rootHas(meta *metadata.FileMetaData, name string) bool {
	root := meta.Schema.Root()
	for i := range root.NumFields() {
		if root.Field(i).Name() == name {
			return true
		}
	}
	return false
}

func sameFields(a, b []*pqColumn) bool {
	for i := range a {
		if !arrow.TypeEqual(a[i].field.Type, b[i].field.Type) || a[i].name != b[i].name {
			return false
		}
	}
	return true
}
