"""Drives the admin page in headless Chromium as a person would: signs in with the token from
a link, reads the backlog, sinks and FAILED tables, clicks Retry on a FAILED event, and keeps a
screenshot.

    python3 page.py http://127.0.0.1:PORT TOKEN FAILED_EVENT_ID SCREENSHOT.png

Prints one JSON object of what it saw; exits non-zero with the reason when something a person
would expect is missing.
"""
import json
import sys

from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait


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

        # Signed in by a link: the token leaves the address bar at once.
        driver.get(base + "/#token=" + token)
        wait.until(lambda d: "published" in d.find_element(By.ID, "relay").text)
        seen["address_after_sign_in"] = driver.current_url
        seen["relay"] = driver.find_element(By.ID, "relay").text
        seen["backlog"] = [r.text for r in driver.find_elements(By.CSS_SELECTOR, "#backlog tbody tr")]
        seen["sinks"] = [r.text for r in driver.find_elements(By.CSS_SELECTOR, "#sinks tbody tr")]
        row = wait.until(ec.visibility_of_element_located(
            (By.XPATH, f"//table[@id='failed']//tr[td[1][normalize-space()='{failed_id}']]")))
        seen["failed_row"] = row.text
        wait.until(lambda d: "events/s" in d.find_element(By.ID, "rates").text)
        seen["rates"] = driver.find_element(By.ID, "rates").text
        driver.save_screenshot(screenshot)

        row.find_element(By.TAG_NAME, "button").click()
        wait.until(lambda d: f"Event {failed_id} is back in the queue" in d.find_element(By.ID, "notice").text)
        seen["notice"] = driver.find_element(By.ID, "notice").text
        # The next refresh no longer lists it.
        wait.until(lambda d: not d.find_elements(
            By.XPATH, f"//table[@id='failed']//tr[td[1][normalize-space()='{failed_id}']]"))
        seen["failed_after_retry"] = [r.text for r in driver.find_elements(By.CSS_SELECTOR, "#failed tbody tr")]
    finally:
        driver.quit()
    print(json.dumps(seen))


if __name__ == "__main__":
    main()
