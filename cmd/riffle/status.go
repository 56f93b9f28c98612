package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/riffle-ml/riffle/server"
)

func statusCmd() *cobra.Command {
	var socket string
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the daemon's groups of jobs, its cache and its traffic",
		Long: `status asks the local daemon what it is doing: each group of jobs sharing a
source (dependent sampling) and each job alone, with its subset's size, its
place and its samples/s; the record cache's bytes, hit rate and evictions;
the daemon's memory budget (its limit split into the record cache, the Go
heap, the image decodes and the jobs' shared memory; what each job holds, and
the opens waiting for room) and its resident memory by kind (docs/memory.md);
the bytes read from storage and served to jobs; and, for each group, the
reads sharing avoided (a record read once for k jobs avoided k-1 reads,
whatever a transform made of it).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			st, err := server.Status(cmd.Context(), socket)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			// The status request's own connection is not a client's.
			fmt.Fprintf(out, "clients: %d\n", max(0, st.Clients-1))
			var avoided int64
			for _, g := range st.Groups {
				avoided += g.Saved
			}
			fmt.Fprintf(out, "read from storage: %s, served to jobs: %s; reads sharing avoided: %d records\n",
				human(float64(st.ReadBytes)), human(float64(st.ServedBytes)), avoided)
			c := st.Cache
			hit := 0.0
			if c.Hits+c.Misses > 0 {
				hit = 100 * float64(c.Hits) / float64(c.Hits+c.Misses)
			}
			fmt.Fprintf(out, "cache: %s of %s, %d items, hit rate %.1f%%, %d evictions\n", human(float64(c.Bytes)), human(float64(c.Budget)), c.Items, hit, c.Evictions)
			if m := st.Memory; m != nil {
				fmt.Fprintf(out, "memory: %s limit: cache %s, heap %s beyond it (Go heap now %s, limit %s; image decodes %s of %s), jobs %s: %s held by %d jobs, %d waiting, %d refused; %d bent below their full memory\n",
					human(float64(m.Limit)), human(float64(m.Cache)), human(float64(m.Heap)), human(float64(m.GoHeap)), human(float64(m.GoLimit)),
					human(float64(m.Decoding)), human(float64(m.Decode)), human(float64(m.Jobs)), human(float64(m.Held)), m.Holders,
					len(m.Waiting), m.Refused, m.Bent)
				fmt.Fprintf(out, "resident: %s (peak %s): anon %s (the Go runtime's %s, its heap %s), shmem %s (jobs' arenas), file %s (mapped files: the binary, and data files' cached pages, which are the page cache's)\n",
					human(float64(m.RSS)), human(float64(m.RSSPeak)), human(float64(m.RSSAnon)), human(float64(m.GoRuntime)), human(float64(m.GoHeap)),
					human(float64(m.RSSShmem)), human(float64(m.RSSFile)))
				for _, w := range m.Waiting {
					fmt.Fprintf(out, "  an open waiting %.0fs for %s\n", w.Seconds, human(float64(w.Bytes)))
				}
			}
			if len(st.Groups) == 0 {
				fmt.Fprintln(out, "no jobs")
			}
			for _, g := range st.Groups {
				fmt.Fprintf(out, "\n%s (%d records", g.Source, g.Records)
				if len(g.Jobs) > 1 || g.Shared > 0 {
					fmt.Fprintf(out, ", %d jobs sharing, %d records read once for several, %d reads avoided", len(g.Jobs), g.Shared, g.Saved)
				}
				if g.PagesKept > 0 || g.PagesDropped > 0 {
					fmt.Fprintf(out, ", %d pages kept in the page cache by need, %d dropped", g.PagesKept, g.PagesDropped)
				}
				if g.RecordsPassed > 0 {
					fmt.Fprintf(out, ", %d records read past it", g.RecordsPassed)
				}
				fmt.Fprintln(out, ")")
				fmt.Fprintf(out, "  %-6s %10s %6s %10s %12s %10s %8s  %s\n", "job", "subset", "epoch", "position", "samples/s", "memory", "reads", "transform")
				for _, j := range g.Jobs {
					reads := "cached" // through the page cache
					if j.Direct {
						reads = "direct"
					}
					mem := human(float64(j.Memory))
					if j.MemoryFull > 0 { // bent while the daemon's memory is short
						mem += "/" + human(float64(j.MemoryFull))
					}
					fmt.Fprintf(out, "  %-6s %10d %6d %10d %12.0f %10s %8s  %s\n", j.ID, j.Subset, j.Epoch, j.Position, j.SamplesSec, mem, reads, j.Transform)
				}
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&socket, "socket", "", "the daemon's socket (default $RIFFLE_SOCKET, $XDG_RUNTIME_DIR/riffle.sock or /tmp/riffle-UID/riffle.sock)")
	return cmd
}
