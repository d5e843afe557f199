package progress

import (
	"fmt"
	"strings"
)

// Lang picks "zh" or "en" from an Accept-Language header; Chinese is the
// default, as for the platform this was built for.
func Lang(acceptLanguage string) string {
	for _, part := range strings.Split(acceptLanguage, ",") {
		tag := strings.ToLower(strings.TrimSpace(strings.SplitN(part, ";", 2)[0]))
		switch {
		case strings.HasPrefix(tag, "zh"):
			return "zh"
		case strings.HasPrefix(tag, "en"):
			return "en"
		}
	}
	return "zh"
}

// QueuedMessage is the caller-facing text of a queue position.
func QueuedMessage(lang string, position, etaSeconds int) string {
	ahead := max(0, position-1)
	if lang == "en" {
		return fmt.Sprintf("Your request is queued: %d ahead of it, expected to start in about %d seconds.", ahead, etaSeconds)
	}
	return fmt.Sprintf("您的诊断请求已排队，前方还有 %d 个任务，预计 %d 秒后开始处理", ahead, etaSeconds)
}

// DegradedMessage and DegradedSuggestion are the design document's 7.3 texts.
func DegradedMessage(lang string) string {
	if lang == "en" {
		return "The diagnosis service is busy; your request has been queued automatically."
	}
	return "诊断服务暂时繁忙，您的请求已自动排入等待队列"
}

// DegradedSuggestion tells the caller where to find the result later.
func DegradedSuggestion(lang string) string {
	if lang == "en" {
		return "You can also check the result later under request history; it completes automatically once the service recovers."
	}
	return "您也可以稍后在「历史诊断」页面查看结果，系统会在恢复后自动完成分析"
}
