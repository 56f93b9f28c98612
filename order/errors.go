package order

import (
	"errors"
	"fmt"
)

// ErrSpec marks an error in what a spec asked for (job.ErrSpec is it).
var ErrSpec = errors.New("invalid job spec")

func specErr(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrSpec}, args...)...)
}
