package dataset

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"path"
	"slices"
	"strings"

	"github.com/riffle-ml/riffle/storage"
)

// Hugging Face datasets directories, as Dataset.save_to_disk and
// DatasetDict.save_to_disk write them: state.json lists the Arrow stream
// files (data-00000-of-00003.arrow, ...) in order, dataset_info.json
// describes the features; a DatasetDict is a dataset_dict.json naming
// its splits and a directory of each. They open as the Arrow dataset of
// their files (arrow.go), indexed in place.

func init() {
	RegisterFormat(Format{Name: "hf", Indexed: true, OpenDir: openHF, DetectDir: detectHF})
}

const maxHFJSON = 64 << 20

func detectHF(ctx context.Context, store storage.Store, root string) bool {
	for _, marker := range []string{"state.json", "dataset_dict.json"} {
		if st, err := store.Stat(ctx, path.Join(root, marker)); err == nil && !st.Dir {
			return true
		}
	}
	return false
}

func openHF(ctx context.Context, root string, opts Options) (Dataset, error) {
	store := opts.Store
	dir := root
	if st, err := store.Stat(ctx, path.Join(root, "dataset_dict.json")); err == nil && !st.Dir {
		var dd struct {
			Splits []string `json:"splits"`
		}
		p := path.Join(root, "dataset_dict.json")
		if err := readJSON(ctx, store, p, &dd); err != nil {
			return nil, err
		}
		split := opts.Split
		if split == "" && len(dd.Splits) == 1 {
			split = dd.Splits[0]
		}
		if split == "" {
			return nil, fmt.Errorf("%s: a DatasetDict of splits %v: say which (split=, --split)", root, dd.Splits)
		}
		if !slices.Contains(dd.Splits, split) || strings.ContainsAny(split, "/\\") || split == "." || split == ".." {
			return nil, fmt.Errorf("%s: no split %q (the splits are %v)", root, split, dd.Splits)
		}
		dir = path.Join(root, split)
	} else if opts.Split != "" {
		return nil, fmt.Errorf("%s: split %q asked of a Dataset directory, which has no splits", root, opts.Split)
	}
	var state struct {
		DataFiles []struct {
			Filename string `json:"filename"`
		} `json:"_data_files"`
	}
	if err := readJSON(ctx, store, path.Join(dir, "state.json"), &state); err != nil {
		return nil, err
	}
	if len(state.DataFiles) == 0 {
		return nil, fmt.Errorf("%s: state.json lists no data files: %w", dir, ErrEmpty)
	}
	var files []string
	for _, f := range state.DataFiles {
		if f.Filename == "" || strings.ContainsAny(f.Filename, "/\\") || f.Filename == ".." {
			return nil, &FormatError{Path: path.Join(dir, "state.json"), Err: fmt.Errorf("data file %q is not a file of the directory: %w", f.Filename, ErrCorrupt)}
		}
		files = append(files, path.Join(dir, f.Filename))
	}
	d, err := openArrow(ctx, files, opts)
	if err != nil {
		return nil, err
	}
	d.inf.Format = "hf"
	var info struct {
		Features json.RawMessage `json:"features"`
	}
	if err := readJSON(ctx, store, path.Join(dir, "dataset_info.json"), &info); err == nil && len(info.Features) > 0 {
		var b bytes.Buffer
		if json.Compact(&b, info.Features) == nil {
			d.inf.Features = b.String()
		}
	}
	return d.dataset(), nil
}

func readJSON(ctx context.Context, store storage.Store, p string, v any) error {
	b, err := store.ReadFile(ctx, p, maxHFJSON)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return &FormatError{Path: p, Err: fmt.Errorf("%v: %w", err, ErrCorrupt)}
	}
	return nil
}
