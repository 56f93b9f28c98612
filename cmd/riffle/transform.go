package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/riffle-ml/riffle/transform"
)

func transformCmd() *cobra.Command {
	var (
		out              string
		seed             uint64
		epoch, id, count int
	)
	cmd := &cobra.Command{
		Use:   "transform SPEC FILE",
		Short: "Run a transform on one file, as the daemon runs it on a record",
		Long: `transform runs a daemon transform (SPEC, as a job's transform=) on FILE
and prints what it did as JSON: the transform's canonical name and output
shape, and for an image transform the box of the source image it took and
whether it mirrored it. --out writes the output's bytes. A random
transform (random_resized_crop) draws as a job seeded --seed does for
record --id in --epoch, so this is the output that job's batch holds.
--count N reports the crops of records --id .. --id+N-1 of the same file,
a line each (the output, --out, is the first's).`,
		Example: "  riffle transform image photo.jpg --out photo.rgb\n" +
			"  riffle transform random_resized_crop:size=224 photo.jpg --seed 7 --epoch 2 --id 41",
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			t, canon, err := transform.New(args[0])
			if err != nil {
				return err
			}
			raw, err := os.ReadFile(args[1])
			if err != nil {
				return err
			}
			enc := json.NewEncoder(cmd.OutOrStdout())
			for k := range max(count, 1) {
				draw := transform.Draw(seed, epoch, id+k)
				buf := make([]byte, t.Size())
				if r, ok := t.(transform.Random); ok {
					err = r.ApplyRandom(raw, buf, draw)
				} else {
					err = t.Apply(raw, buf)
				}
				if err != nil {
					return fmt.Errorf("%s: %w", args[1], err)
				}
				dtype, shape := t.Shape()
				rep := map[string]any{"transform": canon, "dtype": dtype, "shape": shape, "random": transform.IsRandom(t),
					"id": id + k}
				if c, ok, err := transform.CropOf(t, raw, draw); err != nil {
					return fmt.Errorf("%s: %w", args[1], err)
				} else if ok {
					rep["crop"] = c
				}
				if out != "" && k == 0 {
					if err := os.WriteFile(out, buf, 0o644); err != nil {
						return err
					}
				}
				if err := enc.Encode(rep); err != nil {
					return err
				}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&out, "out", "", "write the output's bytes here")
	f.Uint64Var(&seed, "seed", 0, "the job's seed (random transforms)")
	f.IntVar(&epoch, "epoch", 0, "the epoch (random transforms)")
	f.IntVar(&id, "id", 0, "the record's id in the job's dataset (random transforms)")
	f.IntVar(&count, "count", 1, "report records --id .. --id+count-1")
	return cmd
}
