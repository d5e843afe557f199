package config

import "bulwark/pkg/keypool"

// Provider kinds: the API a provider speaks (ProviderCfg.Kind).
const (
	KindAnthropic = "anthropic"
	KindOpenAI    = "openai"
	KindBedrock   = "bedrock"
	KindAzure     = "azure"
	KindLocal     = "local"
)

// Azure authentication (ProviderCfg.Auth).
const (
	AuthAPIKey = "api-key"
	AuthEntra  = "entra"
)

// Unmetered limits of a local key that sets none: its concurrency
// (max_in_flight) is what bounds it.
const (
	unmeteredRPM = 1_000_000
	unmeteredTPM = 1_000_000_000
)

// meteringOf is how a provider of kind settles a call's tokens after
// admission (keypool.Metering, the key pool's doc "Token metering"): OpenAI
// and Azure OpenAI keep the prompt + max_tokens they charged at admission;
// Anthropic and Bedrock adjust their max_tokens estimate to the real usage
// at the end; a local server meters nothing, so usage is as good as any.
func meteringOf(kind string) keypool.Metering {
	switch kind {
	case KindAnthropic, KindBedrock, KindLocal:
		return keypool.MeterUsage
	}
	return keypool.MeterAdmission
}

func knownKind(k string) bool {
	switch k {
	case KindAnthropic, KindOpenAI, KindBedrock, KindAzure, KindLocal:
		return true
	}
	return false
}

// defaultKind is the kind a provider named name has when the file says
// none.
func defaultKind(name string) string {
	if name == "claude" {
		return KindAnthropic
	}
	if knownKind(name) {
		return name
	}
	return ""
}

// validateKeyOfKind checks what a key needs for its provider's kind.
func (c *Config) validateKeyOfKind(field string, k Key, p ProviderCfg, add func(field, format string, args ...any)) {
	needKey := p.Kind == KindAnthropic || p.Kind == KindOpenAI || (p.Kind == KindAzure && p.Auth == AuthAPIKey)
	if needKey && k.APIKey.IsZero() {
		add(field+".api_key", "is required")
	}
	if p.Kind == KindBedrock {
		if k.Region == "" {
			add(field+".region", "is required for a bedrock key")
		}
		if !k.APIKey.IsZero() {
			add(field+".api_key", "must be empty for a bedrock key (AWS credentials come from the credential chain or profile)")
		}
	} else if k.Region != "" || k.Profile != "" {
		add(field, "region and profile are for bedrock keys")
	}
	if p.Kind != KindAzure && (k.Endpoint != "" || k.Deployment != "" || k.PTU) {
		add(field, "endpoint, deployment and ptu are for azure keys")
	}
	if k.ITPMLimit < 0 {
		add(field+".itpm_limit", "must be >= 0 (0: none), got %d", k.ITPMLimit)
	}
	if k.OTPMLimit < 0 {
		add(field+".otpm_limit", "must be >= 0 (0: none), got %d", k.OTPMLimit)
	}
	// Only Anthropic's Messages API limits input and output tokens apart
	// (Bedrock's quota counts both together): on another kind the limits
	// would pace the key to buckets its provider does not have.
	if k.OutputBurndown < 0 {
		add(field+".output_burndown", "must be >= 0 (0: 1), got %d", k.OutputBurndown)
	}
	// Only Bedrock documents a burndown rate; elsewhere an output token
	// counts once.
	if p.Kind != "" && p.Kind != KindBedrock && k.OutputBurndown != 0 {
		add(field, "output_burndown is for bedrock keys (their provider is %s)", p.Kind)
	}
	if p.Kind != "" && p.Kind != KindAnthropic && (k.ITPMLimit != 0 || k.OTPMLimit != 0) {
		add(field, "itpm_limit and otpm_limit are for anthropic keys (their provider is %s)", p.Kind)
	}
	if k.Endpoint != "" {
		if msg := checkBaseURL(k.Endpoint); msg != "" {
			add(field+".endpoint", "%s", msg)
		}
	}
	if p.Kind == KindLocal {
		if k.MaxInFlight <= 0 {
			add(field+".max_in_flight", "is required for a local key (a local server's limit is its concurrency)")
		}
		if k.RPMLimit < 0 || k.TPMLimit < 0 {
			add(field, "rpm_limit and tpm_limit must be >= 0 (0: unmetered), got %d and %d", k.RPMLimit, k.TPMLimit)
		}
		return
	}
	if k.RPMLimit <= 0 {
		add(field+".rpm_limit", "must be > 0, got %d", k.RPMLimit)
	}
	if k.TPMLimit <= 0 {
		add(field+".tpm_limit", "must be > 0, got %d", k.TPMLimit)
	}
}

// keyLimits are a key's metered limits: a local key without limits is
// unmetered.
func keyLimits(k Key) (rpm, tpm int) {
	rpm, tpm = k.RPMLimit, k.TPMLimit
	if rpm == 0 {
		rpm = unmeteredRPM
	}
	if tpm == 0 {
		tpm = unmeteredTPM
	}
	return rpm, tpm
}
