package job

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"path/filepath"
	"slices"
	"strconv"

	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/internal/privdir"
	"github.com/riffle-ml/riffle/storage"
)

// A dataset that grows (refresh "epoch") is read in generations: the
// files it had when first opened, then at each epoch that finds new ones,
// those new files. The generations are put one after another
// (dataset.NewConcat), so every record keeps its id as files are added,
// a resume stays exact, and only the new files are indexed. Files that
// disappear, or change, are an error as they are for any dataset.
//
// The generations, and how many of them each epoch reads, are kept in a
// log beside the indexes: every job of an epoch on this node (each rank
// and DataLoader worker) reads the same generations, whenever it opens,
// and a job resumed at an epoch reads what that epoch read. Ranks on
// several nodes agree when their daemons share the index directory.
type growLog struct {
	Generations [][]string     `json:"generations"`
	Epochs      map[string]int `json:"epochs"` // epoch -> the generations it reads
	// Classes are a directory's classes when it began: its labels.
	Classes []string `json:"classes,omitempty"`
	// Versions are the store's versions of a file list's files when each
	// joined (a directory's files are checked by their folders').
	Versions map[string]string `json:"versions,omitempty"`
}

// grown opens the generations of plan's dataset that plan's epoch reads,
// and says how many: paths are plan.Paths expanded (Env.source).
func (env *Env) grown(ctx context.Context, plan Plan, paths []string) (*source, int, error) {
	store := env.store
	// The files now: a directory's (one file per record), or the paths'.
	var root string
	files := paths
	if len(paths) == 1 {
		if st, err := store.Stat(ctx, paths[0]); err == nil && st.Dir {
			root, files = paths[0], nil
			if f := plan.Dataset.Format; f != "" && f != "dir" {
				return nil, 0, specErr("refresh: a %s directory does not grow by files; a directory of records (ImageFolder), a glob or a list of files does", f)
			}
			err := store.Walk(ctx, root, func(p string, info storage.ObjectInfo) error {
				if !info.Dir && dataset.HasExtension(p, plan.Dataset.Extensions) {
					files = append(files, p)
				}
				return nil
			})
			if err != nil {
				return nil, 0, err
			}
		}
	}
	// The log's name is of the paths as given and every option, printed
	// whole: it names the logs that exist, so it stays as it is (a field
	// added to dataset.Options renames every log).
	k := fnv.New64a()
	fmt.Fprintf(k, "%q|%+v", plan.Paths, plan.Dataset)
	logName := fmt.Sprintf("%016x.rfgrow", k.Sum64())
	logPath := filepath.Join(dataset.CacheDir(env.opts.IndexDir), logName)

	env.growMu.Lock()
	defer env.growMu.Unlock()
	// The log says which files each epoch read, so it is kept as indexes
	// are, through privdir, in a directory only this user may write: a
	// log another user planted would choose the files (and their ids) a
	// resumed epoch reads. Without such a directory there is no log, and
	// a growing dataset cannot promise its epochs: refused with the fix.
	dir, err := privdir.Open(dataset.CacheDir(env.opts.IndexDir))
	if err != nil {
		return nil, 0, specErr("refresh: the log of a growing dataset's files is kept in the index directory, which cannot hold it: %v", err)
	}
	defer dir.Close()
	var lg growLog
	if b, err := dir.ReadFile(logName, maxGrowLog); err == nil {
		if err := json.Unmarshal(b, &lg); err != nil {
			return nil, 0, fmt.Errorf("%s: the log of a growing dataset's files is corrupt (%v): remove it to start it again, from the files as they are now", logPath, err)
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, 0, err
	}
	if lg.Epochs == nil {
		lg.Epochs = map[string]int{}
	}
	epoch := strconv.Itoa(plan.Loader.Epoch)
	g, seen := lg.Epochs[epoch]
	switch {
	case seen && plan.Generations > 0 && g != plan.Generations:
		return nil, 0, specErr("refresh: epoch %d read %d generations of files here, the state says %d: it was saved over another log of this dataset (%s)",
			plan.Loader.Epoch, g, plan.Generations, logPath)
	case !seen && plan.Generations > 0:
		if plan.Generations > len(lg.Generations) {
			return nil, 0, specErr("refresh: the state's epoch %d read %d generations of files, this node's log (%s) has %d", plan.Loader.Epoch, plan.Generations, logPath, len(lg.Generations))
		}
		g = plan.Generations
	case !seen:
		known := map[string]bool{}
		for _, gen := range lg.Generations {
			for _, f := range gen {
				known[f] = true
			}
		}
		now := map[string]bool{}
		var added []string
		for _, f := range files {
			now[f] = true
			if !known[f] {
				added = append(added, f)
			}
		}
		for _, gen := range lg.Generations {
			for _, f := range gen {
				if !now[f] {
					return nil, 0, fmt.Errorf("%s: %w: a file of this growing dataset disappeared; ids past it would change meaning", f, storage.ErrChanged)
				}
				if v, ok := lg.Versions[f]; ok {
					if st, err := store.Stat(ctx, f); err != nil || st.Version != v {
						return nil, 0, fmt.Errorf("%s: %w: a file of this growing dataset was rewritten; its records' ids would change meaning", f, storage.ErrChanged)
					}
				}
			}
		}
		if len(added) > 0 {
			slices.Sort(added)
			lg.Generations = append(lg.Generations, added)
			if root == "" {
				if lg.Versions == nil {
					lg.Versions = map[string]string{}
				}
				for _, f := range added {
					st, err := store.Stat(ctx, f)
					if err != nil {
						return nil, 0, err
					}
					lg.Versions[f] = st.Version
				}
			}
		}
		g = len(lg.Generations)
	}
	if g == 0 {
		return nil, 0, fmt.Errorf("%s: no files: %w", plan.Paths[0], dataset.ErrEmpty)
	}
	parts := make([]concatPart, g)
	for i, gen := range lg.Generations[:g] {
		parts[i] = concatPart{paths: gen, opts: plan.Dataset, name: fmt.Sprintf("generation %d of the files", i)}
		if root != "" {
			parts[i].paths, parts[i].opts.Only = []string{root}, gen
		}
	}
	var src *source
	if g == 1 {
		src, err = env.sets.get(ctx, parts[0].paths, parts[0].opts)
	} else {
		src, err = env.sets.concat(ctx, "growing dataset", parts)
	}
	if err != nil {
		return nil, 0, err
	}
	// Every generation's tree has the directory's classes now: they must
	// be those it began with, or old records' labels would change.
	cls := src.ds.Info().Classes
	if g > 1 {
		cls = src.parts[0].ds.Info().Classes
	}
	if lg.Classes == nil {
		lg.Classes = cls
	} else if !slices.Equal(cls, lg.Classes) {
		env.sets.put(src)
		return nil, 0, specErr("refresh: %s has the classes %q, it began with %q: ImageFolder's labels are the classes a dataset began with, so a class cannot be added or removed",
			plan.Paths[0], cls, lg.Classes)
	}
	if !seen {
		lg.Epochs[epoch] = g
		if err := saveLog(dir, logName, lg); err != nil {
			env.sets.put(src)
			return nil, 0, err
		}
	}
	return src, g, nil
}

// maxGrowLog bounds a log read back: a file name and its generation for
// every file of a dataset of a million files is well under it.
const maxGrowLog = 256 << 20

func saveLog(dir *privdir.Dir, name string, lg growLog) error {
	b, err := json.Marshal(lg)
	if err != nil {
		return err
	}
	return dir.WriteFileSync(name, b)
}
