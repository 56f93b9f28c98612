package columnar

import (
	"bytes"
	"fmt"
	"io"
	"os"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/ipc"
)

// Convert rewrites an Arrow IPC stream or file as an uncompressed IPC
// file: Rinas's conversion (rinas.txt §5), which riffle does not need to
// read a stream (it indexes streams in place) nor a compressed file (it
// decompresses a record batch whole, once), but which lets it read a
// compressed file's rows as their own byte ranges. Dictionaries are unified across batches, as the
// file format wants. It returns the rows written.
func Convert(src io.ReaderAt, size int64, dst io.Writer) (int64, error) {
	head := make([]byte, min(8, size))
	if _, err := src.ReadAt(head, 0); err != nil && err != io.EOF {
		return 0, err
	}
	var (
		schema *arrow.Schema
		next   func() (arrow.RecordBatch, error)
		close  func()
	)
	if bytes.HasPrefix(head, []byte("ARROW1")) {
		fr, err := ipc.NewFileReader(io.NewSectionReader(src, 0, size))
		if err != nil {
			return 0, err
		}
		i := 0
		schema, close = fr.Schema(), func() { fr.Close() }
		next = func() (arrow.RecordBatch, error) {
			if i >= fr.NumRecords() {
				return nil, io.EOF
			}
			i++
			return fr.RecordBatch(i - 1)
		}
	} else {
		sr, err := ipc.NewReader(io.NewSectionReader(src, 0, size))
		if err != nil {
			return 0, err
		}
		schema, close = sr.Schema(), sr.Release
		next = func() (arrow.RecordBatch, error) {
			if !sr.Next() {
				if err := sr.Err(); err != nil {
					return nil, err
				}
				return nil, io.EOF
			}
			rec := sr.RecordBatch()
			rec.Retain()
			return rec, nil
		}
	}
	defer close()
	w, err := ipc.NewFileWriter(dst, ipc.WithSchema(schema), ipc.WithDictionaryDeltas(true))
	if err != nil {
		return 0, err
	}
	var rows int64
	for {
		rec, err := next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return rows, err
		}
		err = w.Write(rec)
		rows += rec.NumRows()
		rec.Release()
		if err != nil {
			return rows, fmt.Errorf("writing: %w", err)
		}
	}
	return rows, w.Close()
}

// ConvertFile converts src to dst (written to a temporary name, then
// renamed, so that dst is never half written).
func ConvertFile(src, dst string) (int64, error) {
	in, err := os.Open(src)
	if err != nil {
		return 0, err
	}
	defer in.Close()
	st, err := in.Stat()
	if err != nil {
		return 0, err
	}
	tmp := dst + ".tmp"
	out, err := os.Create(tmp)
	if err != nil {
		return 0, err
	}
	rows, err := Convert(in, st.Size(), out)
	if err == nil {
		err = out.Sync()
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, dst)
	}
	if err != nil {
		os.Remove(tmp)
		return rows, fmt.Errorf("converting %s: %w", src, err)
	}
	return rows, nil
}
