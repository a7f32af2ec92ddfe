"""Drives the admin page in headless Chromium as a person would: signs in with the token from
a link, reads the backlog, sinks and FAILED tables (rendered on the server, reloaded every few
seconds), clicks Retry on a FAILED event, and keeps a screenshot.

    python3 page.py http://127.0.0.1:PORT TOKEN FAILED_EVENT_ID SCREENSHOT.png

Prints one JSON object of what it saw; exits non-zero with the reason when something a person
would expect is missing.
"""
import json
import sys

from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait


def text_of(driver, locator):
    """The text of the element, or None while it is missing or the page is reloading."""
    try:
        found = driver.find_elements(*locator)
        return found[0].text if found else None
    except StaleElementReferenceException:
        return None


def click(driver, locator):
    """Clicks the element; False while it is missing or the page is reloading."""
    try:
        found = driver.find_elements(*locator)
        if not found:
            return False
        found[0].click()
        return True
    except StaleElementReferenceException:
        return False


def rows_of(driver, selector):
    """The texts of the rows, or None while the page is reloading."""
    try:
        return [r.text for r in driver.find_elements(By.CSS_SELECTOR, selector)] or None
    except StaleElementReferenceException:
        return None


def main() -> None:
    base, token, failed_id, screenshot = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
    options = Options()
    options.binary_location = "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1280,900"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    seen = {}
    try:
        wait = WebDriverWait(driver, 15)
        # Without a token the page asks for one and shows no data.
        driver.get(base + "/")
        wait.until(ec.visibility_of_element_located((By.ID, "login")))
        seen["asks_for_token"] = True
        seen["rows_without_token"] = len(driver.find_elements(By.CSS_SELECTOR, "#failed tbody tr"))
        # A wrong token typed into the form is refused, and still nothing is shown.
        driver.find_element(By.ID, "token").send_keys("not-the-token-0123456789")
        driver.find_element(By.CSS_SELECTOR, "#login-form button").click()
        wait.until(lambda d: "refused" in (text_of(d, (By.ID, "login-message")) or ""))
        seen["wrong_token"] = text_of(driver, (By.ID, "login-message"))
        seen["rows_after_wrong_token"] = len(driver.find_elements(By.CSS_SELECTOR, "#failed tbody tr"))

        # Signed in by a link: the token leaves the address bar at once.
        driver.get(base + "/#token=" + token)
        wait.until(lambda d: "published" in (text_of(d, (By.ID, "relay")) or ""))
        seen["address_after_sign_in"] = driver.current_url
        seen["relay"] = text_of(driver, (By.ID, "relay"))
        seen["backlog"] = wait.until(lambda d: rows_of(d, "#backlog tbody tr"))
        seen["sinks"] = wait.until(lambda d: rows_of(d, "#sinks tbody tr"))
        failed_row = (By.XPATH, f"//table[@id='failed']//tr[td[1][normalize-space()='{failed_id}']]")
        seen["failed_row"] = wait.until(lambda d: text_of(d, failed_row))
        wait.until(lambda d: "events/s" in (text_of(d, (By.ID, "rates")) or ""))
        seen["rates"] = text_of(driver, (By.ID, "rates"))
        seen["session_cookie_http_only"] = all(
            c.get("httpOnly") for c in driver.get_cookies() if c["name"] == "postbox_admin")
        seen["script_sees_cookie"] = "postbox_admin" in driver.execute_script("return document.cookie")
        driver.save_screenshot(screenshot)

        # The page reloads itself every few seconds: find the button again until a click lands.
        wait.until(lambda d: click(d, (By.XPATH, f"//table[@id='failed']//tr[td[1][normalize-space()='{failed_id}']]//button")))
        wait.until(lambda d: f"Event {failed_id} is back in the queue" in (text_of(d, (By.ID, "notice")) or ""))
        seen["notice"] = text_of(driver, (By.ID, "notice"))
        # The next refresh no longer lists it.
        wait.until(lambda d: not d.find_elements(
            By.XPATH, f"//table[@id='failed']//tr[td[1][normalize-space()='{failed_id}']]"))
        seen["failed_after_retry"] = text_of(driver, (By.ID, "failed"))
    finally:
        driver.quit()
    print(json.dumps(seen))


if __name__ == "__main__":
    main()
