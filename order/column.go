package order

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"

	"github.com/RoaringBitmap/roaring/v2"
	"github.com/apache/arrow-go/v18/arrow"

	"github.com/riffle-ml/riffle/columnar"
	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/loader"
	"github.com/riffle-ml/riffle/sampler"
)

// byColumn keeps the rows of in (every row, if nil) whose value in the
// filter's column passes it: the column alone is read once, in file
// order, through a loader of the dataset opened with that column (the
// source's Column, opened by the job over the same files).
func byColumn(ctx context.Context, src *Source, plan Plan, in *roaring.Bitmap) (*roaring.Bitmap, error) {
	f := plan.Filter
	ds := src.DS
	if _, rows := ds.(dataset.Rows); !rows || plan.Mixture != nil {
		return nil, specErr("filter by column %q: a dataset of rows (Arrow, Parquet, Hugging Face) has columns, this one (%s) has records", f.Column, ds.Info().Format)
	}
	col := src.Column
	if col == nil || col.Len() != ds.Len() {
		return nil, fmt.Errorf("filter by column %q: the column's rows are not the dataset's", f.Column)
	}
	l, err := loader.New(ctx, col, sampler.Sequential{N: col.Len()}, loader.Options{BatchSize: 1 << 14, Ordered: true, Epochs: 1})
	if err != nil {
		return nil, err
	}
	defer l.Close()
	schema := col.Info().Schema
	out := roaring.New()
	for {
		b, err := l.Next(ctx)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		rec, release, err := columnar.Record(schema, b.Data[:b.Columns.Len])
		if err != nil {
			b.Release()
			return nil, err
		}
		a := rec.Column(0)
		for i, id := range b.IDs {
			if passes(f.In, f.Min, f.Max, a, i) {
				out.Add(uint32(id))
			}
		}
		release()
		b.Release()
	}
	if in != nil {
		out.And(in)
	}
	return out, nil
}

// passes says whether row i of a passes the tests: its value is one of
// in (a string equal to its text, a number or boolean equal to its
// value), and a number within min and max. A null passes none.
func passes(in []any, lo, hi *float64, a arrow.Array, i int) bool {
	if a.IsNull(i) {
		return false
	}
	s := a.ValueStr(i)
	num, numErr := strconv.ParseFloat(s, 64)
	if lo != nil || hi != nil {
		if numErr != nil || (lo != nil && num < *lo) || (hi != nil && num > *hi) {
			return false
		}
	}
	if len(in) == 0 {
		return true
	}
	for _, v := range in {
		switch v := v.(type) {
		case string:
			if s == v {
				return true
			}
		case float64:
			if numErr == nil && num == v {
				return true
			}
		case bool:
			if s == strconv.FormatBool(v) {
				return true
			}
		}
	}
	return false
}
