package engine

import "encoding/base64"

// A page token is the key of the previous page's last item, base64url
// encoded so that clients treat it as opaque: a run id for ListRuns, a
// worker's role, rank and name for ListWorkers, a snapshot id for
// ListSnapshots. A key is stable while items come and go, so a page never
// repeats or skips an item that stayed.

// encodePageToken returns the token of a page that ended with key.
func encodePageToken(key string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(key))
}

// decodePageToken returns the key in tok, "" for the first page (no
// token). A token that list could not have returned (not one it encoded,
// or a key valid rejects) is INVALID_ARGUMENT naming page_token.
func decodePageToken(tok, list string, valid func(key string) bool) (string, error) {
	if tok == "" {
		return "", nil
	}
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if key := string(b); err == nil && encodePageToken(key) == tok && valid(key) {
		return key, nil
	}
	return "", errorf(ErrInvalidArgument, "page_token: not a token returned by %s", list)
}
