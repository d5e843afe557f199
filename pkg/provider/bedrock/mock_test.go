package bedrock

import (
	"net/http/httptest"
	"testing"
	"time"

	"bulwark/pkg/llm"
	"bulwark/pkg/testkit/mockprovider"
)

// The mock's Bedrock endpoint meters a key as Bedrock meters a quota: per
// access key id and region. (The conformance suite runs the adapter
// against the mock's answers and faults; this is what only Bedrock has.)
func TestMockRegionIsKey(t *testing.T) {
	t.Parallel()
	// 60 RPM over the default 1 s window on a fixed clock: one call.
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	srv, err := mockprovider.New(mockprovider.Config{Now: func() time.Time { return now },
		Keys: map[string]mockprovider.Limits{mockprovider.BedrockKey(testAKID, testRegion): {RPM: 60}}})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv)
	t.Cleanup(ts.Close)
	t.Cleanup(srv.Close)
	c := testClient(ts.URL, ts.Client(), staticCreds(testAKID, testSecret, testToken))

	if _, err := c.Complete(t.Context(), cred(testRegion), textRequest(testModel)); err != nil {
		t.Fatal(err)
	}
	key := mockprovider.Fingerprint(mockprovider.BedrockKey(testAKID, testRegion))
	if st := srv.Stats(); st.Keys[key].OK != 1 || st.Providers["bedrock"].OK != 1 {
		t.Errorf("stats %+v: want one answer on the key %s", st, key)
	}
	if pe := failure(t, c, cred(testRegion), textRequest(testModel)); pe.Class != llm.ClassRateLimited || pe.Code != "ThrottlingException" {
		t.Errorf("got %+v; want the key's ThrottlingException", pe)
	}
	// The same account in another region is another key.
	if _, err := c.Complete(t.Context(), cred("us-west-2"), textRequest(testModel)); err != nil {
		t.Errorf("another region: %v", err)
	}
}
