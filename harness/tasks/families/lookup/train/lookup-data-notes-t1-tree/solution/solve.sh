#!/bin/bash
cd /app && awk '{print $2}' data.txt > notes.txt
