package cache

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestGuard(t *testing.T) {
	t.Parallel()
	g, err := newGuard(ProtectedPatternsDefault(), IgnoredPatternsDefault())
	require.NoError(t, err)
	tests := []struct {
		name string
		a, b string
		same bool
	}{
		{"identical", "DTC P0A80 on ECU BMS", "DTC P0A80 on ECU BMS", true},
		{"dtc differs", "DTC P0A80 after OTA", "DTC P0A81 after OTA", false},
		{"network dtc differs", "lost comm U0100", "lost comm U0101", false},
		{"dtc case-insensitive", "code p0a80", "code P0A80", true},
		{"dtc missing on one side", "code P0A80 and C1234", "code P0A80", false},
		{"dtc order irrelevant", "P0A80 then C1234", "C1234 then P0A80", true},
		{"dtc multiplicity counts", "P0A80 twice P0A80", "P0A80 once", false},
		{"ecu differs", "ECU BMS rebooted", "ECU VCU rebooted", false},
		{"ecu with address", "ECU-7E0 no answer", "ECU-7E8 no answer", false},
		{"ecu followed by lower case word is not an id", "the ECU reports a fault", "the ECU logs a fault", true},
		{"part number differs", "replace 8W0-907-115 module", "replace 8W0-907-116 module", false},
		{"version differs", "firmware 4.2.1 to 4.3.0", "firmware 4.2.1 to 4.3.1", false},
		{"v-version differs", "app v10.3 crash", "app v10.4 crash", false},
		{"vin differs", "VIN LSVAU2180N2183294 fails", "VIN WDBRF61J43F123456 fails", true},
		{"iso timestamp differs", "at 2024-11-03T08:15:22.123Z", "at 2024-11-05T17:02:09.871Z", true},
		{"date and clock time differ", "on 2024-11-03 at 08:15:22.5", "on 2024-12-01 at 23:59:01.25", true},
		{"timestamp with offset", "at 2024-11-03 08:15:22+08:00", "at 2024-11-04 09:00:00+08:00", true},
		{"unix epoch differs", "ts=1730621722", "ts=1730621999", true},
		{"no entities", "why does the car not start", "why does my car not start", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tt.same, g.extract(tt.a).same(g.extract(tt.b)))
		})
	}
}

func TestGuardDisabled(t *testing.T) {
	t.Parallel()
	g, err := newGuard([]string{}, nil)
	require.NoError(t, err)
	require.True(t, g.extract("P0A80").same(g.extract("P0A81")))
}
