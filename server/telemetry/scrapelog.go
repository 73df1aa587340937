package telemetry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"syscall"
)

// scrapeErrorLog is promhttp's error log. A scraper that stops reading
// early (curl .../metrics | head, a timed-out Prometheus) breaks the
// connection under the handler's writes: that is the client's choice, not a
// fault of the coordinator, so it goes to debug; every other error warns.
type scrapeErrorLog struct{ log *slog.Logger }

func (l scrapeErrorLog) Println(v ...any) {
	level := slog.LevelWarn
	for _, x := range v {
		if err, ok := x.(error); ok && clientGone(err) {
			level = slog.LevelDebug
		}
	}
	msg := strings.TrimSuffix(fmt.Sprintln(v...), "\n")
	l.log.Log(context.Background(), level, "metrics scrape: "+msg)
}

// clientGone reports whether err says the peer closed the connection.
func clientGone(err error) bool {
	return errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET)
}
