package main

import (
	"context"
	"fmt"
	"math/bits"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/riffle-ml/riffle/columnar"
	"github.com/riffle-ml/riffle/dataset"
)

func inspectCmd() *cobra.Command {
	var (
		df    datasetFlags
		first int
	)
	cmd := &cobra.Command{
		Use:     "inspect PATH...",
		Short:   "Show a dataset's format, record count, record sizes and first records",
		Example: "  riffle inspect data/train.jsonl\n  riffle inspect images/ --first 3",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ds, err := df.open(cmd.Context(), args)
			if err != nil {
				return err
			}
			defer ds.Close()
			inf := ds.Info()
			rows, isRows := ds.(dataset.Rows)
			files := len(inf.Paths)
			if !isRows {
				// A directory's Paths is its root: count the objects
				// its records live in.
				files = objects(ds)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "format:   %s\nfiles:    %d (%s)\nrecords:  %d\nbytes:    %s\n", inf.Format, files, strings.Join(inf.Paths[:min(3, len(inf.Paths))], ", "), ds.Len(), human(float64(inf.Bytes)))
			if isRows {
				return inspectRows(cmd, rows, first)
			}
			if framed, ok := ds.(dataset.Framed); ok && framed.Checks() {
				n, err := checkFrames(cmd.Context(), ds, framed)
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "checked:  every record's frame (%d records: TFRecord length and data CRCs, a pack's CRC32C)\n", n)
			}
			if inf.RecordSize > 0 {
				fmt.Fprintf(cmd.OutOrStdout(), "record:   %d bytes", inf.RecordSize)
				if inf.Dtype != "" {
					fmt.Fprintf(cmd.OutOrStdout(), ", dtype %s, shape %v", inf.Dtype, inf.Shape)
				}
				fmt.Fprintln(cmd.OutOrStdout())
			} else {
				// Sizes in power-of-two buckets.
				var hist [64]int
				lo, hi := int(^uint(0)>>1), 0
				for id := range ds.Len() {
					loc := ds.Locate(id)
					n := loc.Len
					if n < 0 {
						return &dataset.FormatError{Path: ds.Object(loc.Object).Name(), Offset: loc.Off, Err: fmt.Errorf("record %d has length %d: %w", id, n, dataset.ErrCorrupt)}
					}
					hist[bits.Len(uint(n))]++
					lo, hi = min(lo, n), max(hi, n)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "sizes:    %d to %d bytes, mean %.1f\n", lo, hi, float64(inf.Bytes)/float64(ds.Len()))
				top := 0
				for _, c := range hist {
					top = max(top, c)
				}
				for b, c := range hist {
					if c == 0 {
						continue
					}
					from := 0
					if b > 0 {
						from = 1 << (b - 1)
					}
					fmt.Fprintf(cmd.OutOrStdout(), "  %8d-%-8d %9d %s\n", from, 1<<b-1, c, strings.Repeat("#", max(1, 40*c/top)))
				}
			}
			if len(inf.Classes) > 0 {
				fmt.Fprintf(cmd.OutOrStdout(), "classes:  %d (%s)\n", len(inf.Classes), strings.Join(inf.Classes[:min(10, len(inf.Classes))], ", "))
			}
			if inf.Header != "" {
				fmt.Fprintf(cmd.OutOrStdout(), "header:   %s\n", inf.Header)
			}
			framed, _ := ds.(dataset.Framed)
			for id := range min(first, ds.Len()) {
				loc := ds.Locate(id)
				b, err := readRecord(cmd.Context(), ds, framed, id)
				if err != nil {
					return err
				}
				b = b[:min(len(b), 256)]
				label := ""
				if l := ds.Label(id); l >= 0 && l < len(inf.Classes) {
					label = fmt.Sprintf(" label %d (%s)", l, inf.Classes[l])
				} else if l >= 0 {
					label = fmt.Sprintf(" label %d", l)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "record %d: %s offset %d, %d bytes%s\n  %s\n", id, ds.Object(loc.Object).Name(), loc.Off, loc.Len, label, preview(b, loc.Len))
			}
			return nil
		},
	}
	df.register(cmd)
	cmd.Flags().IntVar(&first, "first", 5, "how many records to show")
	return cmd
}

// readRecord reads record id whole, in its frame if the format has one,
// checking the frame (TFRecord CRCs, unless --skip-crc).
func readRecord(ctx context.Context, ds dataset.Dataset, framed dataset.Framed, id int) ([]byte, error) {
	loc := ds.Locate(id)
	head, tail := 0, 0
	if framed != nil && framed.Checks() {
		head, tail = framed.Frame()
	} else {
		framed = nil
	}
	b := make([]byte, head+loc.Len+tail)
	if err := ds.Object(loc.Object).ReadAt(ctx, b, loc.Off-int64(head)); err != nil {
		return nil, err
	}
	if framed != nil {
		if err := framed.Verify(id, b); err != nil {
			return nil, err
		}
	}
	return b[head : head+loc.Len], nil
}

// objects is the number of objects ds's records live in.
func objects(ds dataset.Dataset) int {
	n := 0
	for id := range ds.Len() {
		n = max(n, ds.Locate(id).Object+1)
	}
	return n
}

// checkFrames reads every record in its frame and verifies it, in reads
// of about a MiB over the records of one object that lie together: a bad
// CRC anywhere in the dataset is an error, not only in the first records.
// It returns the number of records checked.
func checkFrames(ctx context.Context, ds dataset.Dataset, framed dataset.Framed) (int, error) {
	const window = 1 << 20
	head, tail := framed.Frame()
	var buf []byte
	obj, at := -1, int64(0) // buf holds object obj's bytes from at
	for id := range ds.Len() {
		if err := ctx.Err(); err != nil {
			return id, err
		}
		loc := ds.Locate(id)
		from, to := loc.Off-int64(head), loc.Off+int64(loc.Len+tail)
		if loc.Object != obj || from < at || to > at+int64(len(buf)) {
			r := ds.Object(loc.Object)
			n := min(max(to-from, window), r.Size()-from)
			if n < to-from {
				n = to - from // past the end: the read reports it
			}
			buf = slices.Grow(buf[:0], int(n))[:n]
			if err := r.ReadAt(ctx, buf, from); err != nil {
				return id, err
			}
			obj, at = loc.Object, from
		}
		if err := framed.Verify(id, buf[from-at:to-at]); err != nil {
			return id, err
		}
	}
	return ds.Len(), nil
}

// preview shows text as text and anything else as hex.
func preview(b []byte, total int) string {
	more := ""
	if total > len(b) {
		more = "..."
	}
	if utf8.Valid(b) && !strings.ContainsFunc(string(b), func(r rune) bool { return r < 32 && r != '\n' && r != '\t' && r != '\r' }) {
		return fmt.Sprintf("%q%s", b, more)
	}
	if len(b) > 48 {
		b, more = b[:48], "..."
	}
	return fmt.Sprintf("% x%s", b, more)
}

// inspectRows shows a dataset of rows: its columns, features and first
// rows as JSON.
func inspectRows(cmd *cobra.Command, ds dataset.Rows, first int) error {
	out := cmd.OutOrStdout()
	inf := ds.Info()
	fmt.Fprintf(out, "columns:  %d\n", len(inf.Columns))
	for _, c := range inf.Columns {
		null := ""
		if c.Nullable {
			null = ", nullable"
		}
		fmt.Fprintf(out, "  %-20s %s%s\n", c.Name, c.Type, null)
	}
	if inf.Features != "" {
		fmt.Fprintf(out, "features: %s\n", inf.Features)
	}
	ids := make([]int, min(first, ds.Len()))
	for i := range ids {
		ids[i] = i
	}
	if len(ids) == 0 {
		return nil
	}
	msg, _, err := dataset.ReadRows(cmd.Context(), ds, ids)
	if err != nil {
		return err
	}
	rows, err := columnar.JSONRows(inf.Schema, msg)
	if err != nil {
		return err
	}
	for i, r := range rows {
		loc := ds.Locate(i)
		if len(r) > 400 {
			r = r[:400] + "..."
		}
		fmt.Fprintf(out, "record %d: %s offset %d, %d bytes\n  %s\n", i, ds.Object(loc.Object).Name(), loc.Off, loc.Len, r)
	}
	return nil
}
